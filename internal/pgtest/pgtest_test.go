package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/pgtest"
)

// A server of the test's own: passwords asked over TCP, data kept across a kill.
func TestStartKillRestart(t *testing.T) {
	s := pgtest.Start(t, pgtest.Options{Password: "s3cret"})
	s.Exec(t, "postgres", "CREATE TABLE t (x int)")
	s.Exec(t, "postgres", "INSERT INTO t VALUES (1)")
	s.Restart()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.Connect(ctx, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after a kill and a restart: %d rows, %v; want the committed row", n, err)
	}
	cfg := s.ConnConfig("postgres")
	cfg.Password = "wrong"
	if c, err := pgxConnect(ctx, cfg); err == nil {
		c.Close(ctx)
		t.Fatal("a wrong password was let in")
	}
}

func TestShared(t *testing.T) {
	s := pgtest.Shared(t)
	db := s.NewDB(t)
	s.Exec(t, db, "CREATE TABLE t (x int)")
}

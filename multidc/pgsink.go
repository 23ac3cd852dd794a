package multidc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/stormdock/stormdock/cluster"
)

// PGSink writes a mirrored job's records as rows of a PostgreSQL table, exactly once by
// construction. The table (made by the router when missing) is
//
//	"offset" bigint PRIMARY KEY, link text, epoch bigint, record jsonb, written timestamptz
//
// and beside it, in the same schema, stormdock_fence holds one row per sink table: the job
// that writes it, the delivered offset and the fencing epoch. A router that takes the sink
// over (OpenPGSink) bumps the epoch in one transaction; every batch afterwards is one
// statement that advances the row's delivered offset from the batch's first offset minus one
// to its last, on condition that the epoch is still the router's, and inserts the rows only
// if it did. A router whose epoch was bumped writes nothing (ErrFenced) and stops; a batch
// whose commit was never answered (a dropped connection, a server restart) is found
// committed or not from the row, so nothing is written twice or skipped. The row also tells
// a new router where to continue.
type PGSink struct {
	out   cluster.PostgresOutput
	opts  FencingOptions
	log   *slog.Logger
	table string // the fence row's key: [SCHEMA.]TABLE as in the URL
	qual  string // the data table, quoted for SQL
	fence string // the fence table, quoted for SQL
	app   string // application_name of this job's router sessions

	conn      *pgx.Conn
	epoch     int64
	delivered int64
	lastErr   string // the last connect or write error, to log a change once
}

// ErrFenced is a fencing sink's refusal of a router whose epoch is no longer the sink's:
// another router took the sink over. The router stops; what it had not written is the new
// leader's to write.
var ErrFenced = errors.New("multidc: fenced off: another router took the sink over")

// pgFenceTable is the fence table's name, in the data table's schema.
const pgFenceTable = "stormdock_fence"

func pgDataDDL(qual string) string {
	return `CREATE TABLE ` + qual + ` ("offset" bigint PRIMARY KEY, link text NOT NULL, epoch bigint NOT NULL, record jsonb NOT NULL, written timestamptz NOT NULL DEFAULT clock_timestamp())`
}

func pgFenceDDL(qual string) string {
	return `CREATE TABLE ` + qual + ` ("table" text PRIMARY KEY, job text NOT NULL, epoch bigint NOT NULL, delivered bigint NOT NULL, router text NOT NULL DEFAULT '', updated timestamptz NOT NULL DEFAULT clock_timestamp())`
}

// pgColumn is a column a sink table must have: its type as format_type() spells it.
type pgColumn struct{ name, typ string }

var (
	pgDataColumns  = []pgColumn{{"offset", "bigint"}, {"link", "text"}, {"epoch", "bigint"}, {"record", "jsonb"}}
	pgFenceColumns = []pgColumn{{"table", "text"}, {"job", "text"}, {"epoch", "bigint"}, {"delivered", "bigint"}, {"router", "text"}}
)

// OpenPGSink connects, makes the tables when missing (or checks their shape), and takes the
// sink over: it bumps the fencing epoch, after which no earlier router's write commits.
func OpenPGSink(ctx context.Context, raw string, opts FencingOptions) (*PGSink, error) {
	out, err := cluster.ParsePostgresOutput(raw)
	if err != nil {
		return nil, fmt.Errorf("multidc: postgres sink: %w", err)
	}
	opts = opts.withDefaults()
	s := &PGSink{out: out, opts: opts, table: out.Table, qual: pgx.Identifier{out.Table}.Sanitize(),
		fence: pgx.Identifier{pgFenceTable}.Sanitize(), app: appName(opts.Job)}
	if out.Schema != "" {
		s.table = out.Schema + "." + out.Table
		s.qual = pgx.Identifier{out.Schema, out.Table}.Sanitize()
		s.fence = pgx.Identifier{out.Schema, pgFenceTable}.Sanitize()
	}
	s.log = opts.Logger.With("sink", s.String())
	c, err := s.connect(ctx)
	if err != nil {
		return nil, err
	}
	s.conn = c
	if err := s.ensureTable(ctx, s.fence, pgFenceTable, pgFenceDDL(s.fence), pgFenceColumns, "table"); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.ensureTable(ctx, s.qual, s.table, pgDataDDL(s.qual), pgDataColumns, "offset"); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.takeOver(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// appName is the application_name of a job's router sessions (pg_stat_activity): a new
// leader ends the old one's sessions by it. PostgreSQL keeps 63 bytes of it.
func appName(job string) string {
	n := "stormdock-router " + job
	return n[:min(len(n), 63)]
}

// String names the sink without its credentials.
func (s *PGSink) String() string {
	return fmt.Sprintf("postgres://%s@%s/%s?table=%s", s.out.User, net.JoinHostPort(s.out.Host, s.out.Port), s.out.DB, s.table)
}

// Epoch is the fencing epoch this router holds.
func (s *PGSink) Epoch() int64 { return s.epoch }

func (s *PGSink) connect(ctx context.Context) (*pgx.Conn, error) {
	sslmode := s.out.SSLMode
	if sslmode == "" {
		sslmode = "prefer"
	}
	// Everything comes from the URL (checked to be plain identifiers) and the password
	// source: passfile=/dev/null keeps ~/.pgpass out, the password below overrides
	// PGPASSWORD.
	cs := fmt.Sprintf("host=%s port=%s dbname=%s user=%s sslmode=%s connect_timeout=5 passfile=/dev/null",
		s.out.Host, s.out.Port, s.out.DB, s.out.User, sslmode)
	cfg, err := pgx.ParseConfig(cs)
	if err != nil {
		return nil, fmt.Errorf("multidc: postgres sink %s: %w", s, err)
	}
	if s.opts.RootCAs != nil {
		// A private CA for verify-full and verify-ca (pgx would take the system's roots,
		// or a file named in the URL, which the spec may not name: hostile input).
		verifyWith(cfg, sslmode, s.opts.RootCAs)
	}
	cfg.Password = ""
	if s.opts.Password != nil {
		pw, err := s.opts.Password()
		if err != nil {
			return nil, fmt.Errorf("multidc: postgres sink %s: read its password: %w", s, err)
		}
		cfg.Password = strings.TrimRight(string(pw), "\r\n")
	}
	if s.opts.Dial != nil {
		cfg.DialFunc = s.opts.Dial
	}
	cfg.RuntimeParams["application_name"] = s.app
	// A session that a cut router leaves inside a transaction holds no lock for long.
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "5000"
	cctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	defer cancel()
	c, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("multidc: postgres sink %s: cannot connect: %w", s, err)
	}
	return c, nil
}

// verifyWith makes the server's certificate checked against roots, as sslmode asks:
// verify-full checks the name too (pgx set ServerName), verify-ca the chain alone.
func verifyWith(cfg *pgx.ConnConfig, sslmode string, roots *x509.CertPool) {
	set := func(tc *tls.Config) *tls.Config {
		if tc == nil {
			return nil
		}
		switch sslmode {
		case "verify-full":
			tc = tc.Clone()
			tc.RootCAs = roots
		case "verify-ca":
			name := tc.ServerName
			tc = &tls.Config{ServerName: name, MinVersion: tls.VersionTLS12,
				InsecureSkipVerify: true, //nolint:gosec // the chain is verified below; verify-ca checks no name
				VerifyConnection: func(cs tls.ConnectionState) error {
					if len(cs.PeerCertificates) == 0 {
						return errors.New("the server sent no certificate")
					}
					inter := x509.NewCertPool()
					for _, c := range cs.PeerCertificates[1:] {
						inter.AddCert(c)
					}
					_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
					return err
				}}
		}
		return tc
	}
	cfg.TLSConfig = set(cfg.TLSConfig)
	for _, fb := range cfg.Fallbacks {
		fb.TLSConfig = set(fb.TLSConfig)
	}
}

// ensureTable makes a sink table when it is missing and checks the shape of one that exists:
// the columns the router writes, with their types, key the unique one, every other column
// nullable or with a default.
func (s *PGSink) ensureTable(ctx context.Context, qual, name, ddl string, cols []pgColumn, key string) error {
	var exists bool
	if err := s.conn.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, qual).Scan(&exists); err != nil {
		return fmt.Errorf("multidc: postgres sink %s: look for table %s: %w", s, name, err)
	}
	if !exists {
		_, err := s.conn.Exec(ctx, strings.Replace(ddl, "CREATE TABLE", "CREATE TABLE IF NOT EXISTS", 1))
		var pe *pgconn.PgError
		switch {
		case err == nil:
			s.log.Info("postgres sink: made table", "table", name)
			return nil
		case errors.As(err, &pe) && pe.Code == "23505":
			// Two routers made it at once (pg_type's unique index): it exists now.
		case errors.As(err, &pe) && pe.Code == "42501":
			return fmt.Errorf("multidc: postgres sink %s: table %s does not exist and role %s may not make it (%s): make it as %s",
				s, name, s.out.User, pe.Message, ddl)
		default:
			return fmt.Errorf("multidc: postgres sink %s: make table %s: %w", s, name, err)
		}
	}
	rows, err := s.conn.Query(ctx, `SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull, a.atthasdef
		FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`, qual)
	if err != nil {
		return fmt.Errorf("multidc: postgres sink %s: read the columns of %s: %w", s, name, err)
	}
	type col struct {
		typ              string
		notNull, hasDeft bool
	}
	have := map[string]col{}
	for rows.Next() {
		var n string
		var c col
		if err := rows.Scan(&n, &c.typ, &c.notNull, &c.hasDeft); err != nil {
			rows.Close()
			return fmt.Errorf("multidc: postgres sink %s: read the columns of %s: %w", s, name, err)
		}
		have[n] = c
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("multidc: postgres sink %s: read the columns of %s: %w", s, name, err)
	}
	wrong := func(why string) error {
		return fmt.Errorf("multidc: postgres sink %s: table %s is not a sink table: %s; it must look like %s (or name a table that does not exist: the router makes it)",
			s, name, why, ddl)
	}
	want := map[string]bool{}
	for _, c := range cols {
		want[c.name] = true
		h, ok := have[c.name]
		switch {
		case !ok:
			return wrong(fmt.Sprintf("it has no column %q", c.name))
		case h.typ != c.typ:
			return wrong(fmt.Sprintf("column %q is %s, not %s", c.name, h.typ, c.typ))
		}
	}
	for n, h := range have {
		if !want[n] && h.notNull && !h.hasDeft {
			return wrong(fmt.Sprintf("column %q is NOT NULL without a default, and the router does not write it", n))
		}
	}
	var unique bool
	err = s.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i
		WHERE i.indrelid = to_regclass($1) AND (i.indisprimary OR i.indisunique) AND i.indnkeyatts = 1 AND i.indpred IS NULL
		AND (SELECT attname FROM pg_attribute WHERE attrelid = i.indrelid AND attnum = i.indkey[0]) = $2)`, qual, key).Scan(&unique)
	if err != nil {
		return fmt.Errorf("multidc: postgres sink %s: read the keys of %s: %w", s, name, err)
	}
	if !unique {
		return wrong(fmt.Sprintf("column %q is not its primary key", key))
	}
	return nil
}

// takeOver ends the sessions of earlier routers of the job, then bumps the fencing epoch and
// reads where the sink stands, in one transaction.
func (s *PGSink) takeOver(ctx context.Context) error {
	// Their sessions hold no lock between batches (each batch is one statement), but
	// ending them makes a router that is still running fail at once rather than at its
	// next batch. Sessions of other roles are not this role's to end: it is only quicker.
	if _, err := s.conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND usename = current_user AND pid <> pg_backend_pid()`, s.app); err != nil {
		s.log.Warn("postgres sink: could not end the sessions of earlier routers", "err", err)
	}
	tx, err := s.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("multidc: postgres sink %s: take over: %w", s, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '5s'`); err != nil {
		return fmt.Errorf("multidc: postgres sink %s: take over: %w", s, err)
	}
	var job string
	err = tx.QueryRow(ctx, `INSERT INTO `+s.fence+` ("table", job, epoch, delivered, router) VALUES ($1, $2, 1, -1, $3)
		ON CONFLICT ("table") DO UPDATE SET epoch = `+s.fence+`.epoch + 1, router = EXCLUDED.router, updated = clock_timestamp()
		RETURNING job, epoch, delivered`, s.table, s.opts.Job, s.opts.Router).Scan(&job, &s.epoch, &s.delivered)
	if err != nil {
		return fmt.Errorf("multidc: postgres sink %s: bump the fencing epoch: %w", s, err)
	}
	if job != s.opts.Job {
		return fmt.Errorf("multidc: postgres sink %s: table %s is the output of job %s (its row in %s): name another table, or delete that row if job %s is gone for good",
			s, s.table, job, pgFenceTable, job)
	}
	var beyond *int64
	if err := tx.QueryRow(ctx, `SELECT max("offset") FROM `+s.qual+` WHERE "offset" > $1`, s.delivered).Scan(&beyond); err != nil {
		return fmt.Errorf("multidc: postgres sink %s: read the table: %w", s, err)
	}
	if beyond != nil {
		if s.epoch == 1 {
			return fmt.Errorf("multidc: postgres sink %s: table %s holds rows that no router of job %s wrote (up to offset %d): name an empty table or one the router makes",
				s, s.table, s.opts.Job, *beyond)
		}
		return fmt.Errorf("multidc: postgres sink %s: table %s holds offsets up to %d, beyond the delivered offset %d of its row in %s: rows were written around the router; remove them or name another table",
			s, s.table, *beyond, s.delivered, pgFenceTable)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("multidc: postgres sink %s: take over: %w", s, err)
	}
	s.log.Info("postgres sink: taken over", "epoch", s.epoch, "delivered", s.delivered)
	return nil
}

// LastOffset is the last offset in the table, as the fence row says.
func (s *PGSink) LastOffset(context.Context) (int64, error) { return s.delivered, nil }

// pgWrite inserts a batch's rows if and only if the fence row still holds this router's epoch
// and the offset before the batch: one statement, so one transaction, and no lock held
// between statements.
const pgWrite = `WITH f AS (
	UPDATE %[1]s SET delivered = $1, updated = clock_timestamp() WHERE "table" = $2 AND epoch = $3 AND delivered = $4 RETURNING 1
) INSERT INTO %[2]s ("offset", link, epoch, record)
	SELECT o, l, $3, r::jsonb FROM unnest($5::bigint[], $6::text[], $7::text[]) AS b(o, l, r) WHERE EXISTS (SELECT 1 FROM f)`

// Write inserts recs (consecutive offsets right after the last written) in one transaction
// conditioned on the router's epoch. A batch whose earlier attempt committed unseen is not
// written again: the fence row says how far it got.
func (s *PGSink) Write(ctx context.Context, recs []Record) error {
	for len(recs) > 0 {
		first, last := recs[0].Offset, recs[len(recs)-1].Offset
		if first != s.delivered+1 {
			return fmt.Errorf("%w: postgres sink %s: batch from offset %d after delivered offset %d", ErrSinkBroken, s, first, s.delivered)
		}
		n, err := s.exec(ctx, recs)
		if err == nil && n == int64(len(recs)) {
			s.delivered = last
			return nil
		}
		if err == nil && n != 0 {
			return fmt.Errorf("%w: postgres sink %s: %d of %d rows inserted", ErrSinkBroken, s, n, len(recs))
		}
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "23505" {
				return fmt.Errorf("%w: postgres sink %s: offsets %d-%d already in table %s but not in its row in %s: rows were written around the router",
					ErrSinkBroken, s, first, last, s.table, pgFenceTable)
			}
			// Committed or not, the fence row says; read it when the server answers again.
			s.drop()
			return fmt.Errorf("multidc: postgres sink %s: write offsets %d-%d: %w", s, first, last, err)
		}
		// Nothing inserted: the row is not where this router left it.
		epoch, delivered, err := s.row(ctx)
		if err != nil {
			s.drop()
			return err
		}
		switch {
		case epoch != s.epoch:
			return fmt.Errorf("%w (postgres sink %s: epoch %d, this router's %d)", ErrFenced, s, epoch, s.epoch)
		case delivered >= last:
			// An earlier attempt of this batch committed, its answer lost.
			s.log.Info("postgres sink: the batch was committed by an earlier attempt", "first", first, "last", last)
			s.delivered = last
			return nil
		case delivered >= first:
			s.log.Info("postgres sink: part of the batch was committed by an earlier attempt", "first", first, "delivered", delivered)
			recs = recs[delivered-first+1:]
			s.delivered = delivered
		default:
			return fmt.Errorf("%w: postgres sink %s: its row in %s says offset %d was delivered, this router %d", ErrSinkBroken, s, pgFenceTable, delivered, s.delivered)
		}
	}
	return nil
}

// exec runs the conditional insert of a batch and returns how many rows it inserted.
func (s *PGSink) exec(ctx context.Context, recs []Record) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	defer cancel()
	if err := s.ensureConn(ctx); err != nil {
		return 0, err
	}
	offs := make([]int64, len(recs))
	links := make([]string, len(recs))
	data := make([]string, len(recs))
	for i, r := range recs {
		offs[i], links[i], data[i] = r.Offset, r.Link, string(r.Data)
	}
	tag, err := s.conn.Exec(ctx, fmt.Sprintf(pgWrite, s.fence, s.qual),
		recs[len(recs)-1].Offset, s.table, s.epoch, recs[0].Offset-1, offs, links, data)
	if err != nil {
		return 0, err
	}
	s.healed()
	return tag.RowsAffected(), nil
}

// row reads the fence row.
func (s *PGSink) row(ctx context.Context) (epoch, delivered int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.WriteTimeout)
	defer cancel()
	if err := s.ensureConn(ctx); err != nil {
		return 0, 0, err
	}
	err = s.conn.QueryRow(ctx, `SELECT epoch, delivered FROM `+s.fence+` WHERE "table" = $1`, s.table).Scan(&epoch, &delivered)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, fmt.Errorf("%w: postgres sink %s: its row in %s is gone", ErrFenced, s, pgFenceTable)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("multidc: postgres sink %s: read its row in %s: %w", s, pgFenceTable, err)
	}
	return epoch, delivered, nil
}

// ensureConn connects again after a connection was lost.
func (s *PGSink) ensureConn(ctx context.Context) error {
	if s.conn != nil && !s.conn.IsClosed() {
		return nil
	}
	s.drop()
	c, err := s.connect(ctx)
	if err != nil {
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			s.log.Warn("postgres sink: cannot reach the database", "err", err)
		}
		return err
	}
	s.conn = c
	return nil
}

// healed notes that the database answers again.
func (s *PGSink) healed() {
	if s.lastErr != "" {
		s.log.Info("postgres sink: the database answers again")
		s.lastErr = ""
	}
}

// drop closes the connection, after an error that may have left it in any state.
func (s *PGSink) drop() {
	if s.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.conn.Close(ctx)
		cancel()
		s.conn = nil
	}
}

// Sync does nothing: a committed statement is durable.
func (s *PGSink) Sync(context.Context) error { return nil }

// Close closes the connection.
func (s *PGSink) Close() error {
	s.drop()
	return nil
}

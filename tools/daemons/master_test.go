package daemons

import (
	"testing"

	"github.com/urfave/cli/v2"
)

func TestMemoryLimitFlag(t *testing.T) {
	for _, tc := range []struct {
		arg     string
		want    int64
		wantErr bool
	}{
		{arg: "", want: 0},
		{arg: "768Mi", want: 768 << 20},
		{arg: "2Gi", want: 2 << 30},
		{arg: "lots", wantErr: true},
		{arg: "-1Gi", wantErr: true},
		{arg: "0", wantErr: true},
		{arg: "1Mi", wantErr: true}, // below any master's floor: collection would take half a core for nothing
	} {
		var got int64
		var err error
		app := &cli.App{Name: "master", Flags: []cli.Flag{&cli.StringFlag{Name: "memory-limit"}}, Action: func(c *cli.Context) error {
			got, err = memoryLimitOf(c)
			return nil
		}}
		args := []string{"master"}
		if tc.arg != "" {
			args = append(args, "--memory-limit", tc.arg)
		}
		if rerr := app.Run(args); rerr != nil {
			t.Fatalf("%q: app.Run: %v", tc.arg, rerr)
		}
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("--memory-limit %q: %d, %v; want %d, error %v", tc.arg, got, err, tc.want, tc.wantErr)
		}
	}
}

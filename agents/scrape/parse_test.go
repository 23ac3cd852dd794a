package scrape

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		file    string
		lim     Limits
		want    []string // "name{labels} counter|gauge value"
		dropped string   // a substring of the report; "" wants none
		err     string
	}{
		{file: "wordcount.prom", want: []string{"input_backlog gauge 42", "lines_processed_total counter 1234"}},
		{file: "mixed.prom", want: []string{
			"latency_seconds_count counter 4", "latency_seconds_sum counter 0.7",
			`queue_depth{queue="a",shard="1"} gauge 7`, `queue_depth{queue="b",shard="2"} gauge 5`, `queue_depth{queue="c"} gauge 1`,
			"rpc_count counter 30", "rpc_sum counter 12", "untyped_thing gauge 3",
		}, dropped: "names stormdock measures itself (cpu)"},
		{file: "mixed.prom", dropped: "non-finite or negative counter values"},
		{file: "garbage.prom", err: "not the Prometheus text format"},
		{file: "many.prom", lim: Limits{MaxSeries: 10}, dropped: "490 series over the limit of 10"},
		{file: "longlabel.prom", want: []string{"ok gauge 2"}, dropped: "label sets over the limits (long)"},
		{file: "wordcount.prom", lim: Limits{MaxBytes: 100}, err: "metrics body too large"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			got, dropped, err := Parse(bytes.NewReader(b), tc.lim)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				if got != nil {
					t.Errorf("a failed parse kept %d series", len(got))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want != nil {
				var lines []string
				for _, s := range got {
					kind := "gauge"
					if s.Counter {
						kind = "counter"
					}
					lines = append(lines, fmt.Sprintf("%s %s %v", s.ID(), kind, s.Value))
				}
				if strings.Join(lines, "\n") != strings.Join(tc.want, "\n") {
					t.Errorf("series:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(tc.want, "\n"))
				}
			}
			if tc.dropped == "" && dropped != "" && tc.want == nil {
				t.Errorf("dropped %q, want nothing", dropped)
			}
			if tc.dropped != "" && !strings.Contains(dropped, tc.dropped) {
				t.Errorf("dropped = %q, want it to say %q", dropped, tc.dropped)
			}
			if len(dropped) > 310 {
				t.Errorf("the report is %d bytes: it must stay one short line", len(dropped))
			}
		})
	}
}

// TestParseExactLimit: a body of exactly MaxBytes is read; one byte more is refused.
func TestParseExactLimit(t *testing.T) {
	body := "a 1\n"
	if _, _, err := Parse(strings.NewReader(body), Limits{MaxBytes: int64(len(body))}); err != nil {
		t.Fatalf("a body of exactly the limit: %v", err)
	}
	if _, _, err := Parse(strings.NewReader(body+"\n"), Limits{MaxBytes: int64(len(body))}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a body one byte over the limit: err = %v", err)
	}
}

// FuzzParse: whatever a worker sends, Parse returns within its bounds: at most MaxSeries
// series, names and labels within their sizes, finite values, a report of one short line.
func FuzzParse(f *testing.F) {
	ents, _ := os.ReadDir("testdata")
	for _, e := range ents {
		if b, err := os.ReadFile(filepath.Join("testdata", e.Name())); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("a{b=\"\\\"\\n\"} 1\n"))
	lim := Limits{MaxSeries: 5, MaxLabels: 2, MaxNameBytes: 20, MaxLabelBytes: 10, MaxBytes: 4096}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, dropped, err := Parse(bytes.NewReader(b), lim)
		if err != nil {
			if got != nil {
				t.Fatal("series kept from a failed parse")
			}
			if len(err.Error()) > 400 || strings.ContainsAny(err.Error(), "\n\r") {
				t.Fatalf("error is not one short line: %q", err)
			}
			return
		}
		if len(got) > lim.MaxSeries {
			t.Fatalf("%d series kept, limit %d", len(got), lim.MaxSeries)
		}
		if len(dropped) > 310 || strings.ContainsAny(dropped, "\n\r") {
			t.Fatalf("report is not one short line: %q", dropped)
		}
		for _, s := range got {
			if len(s.Name) > lim.MaxNameBytes || s.Value != s.Value || Reserved(s.Name) || ignored(s.Name) {
				t.Fatalf("series %q = %v kept", s.Name, s.Value)
			}
			if strings.Count(s.Labels, `="`) > lim.MaxLabels {
				t.Fatalf("series %s kept with more than %d labels", s.ID(), lim.MaxLabels)
			}
		}
	})
}

package api

import (
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestAgentRequestSignature(t *testing.T) {
	key, other := []byte("0123456789abcdef0123456789abcdef"), []byte("fedcba9876543210fedcba9876543210")
	now := time.Unix(1_800_000_000, 0)
	uri := "/v1/logs?job=wc&tail=100&worker=3"
	tok := SignAgentRequest(key, "GET", uri, now, AgentTokenTTL)
	if err := VerifyAgentRequest(key, "GET", uri, tok, now.Add(30*time.Second)); err != nil {
		t.Fatalf("a fresh signature: %v", err)
	}
	for _, tc := range []struct {
		name             string
		key              []byte
		method, uri, tok string
		at               time.Time
	}{
		{"another worker", key, "GET", "/v1/logs?job=wc&tail=100&worker=4", tok, now},
		{"another method", key, "POST", uri, tok, now},
		{"another key", other, "GET", uri, tok, now},
		{"expired", key, "GET", uri, tok, now.Add(2 * time.Minute)},
		{"valid too long", key, "GET", uri, SignAgentRequest(key, "GET", uri, now, time.Hour), now},
		{"malformed", key, "GET", uri, "sda1.x.y", now},
		{"empty", key, "GET", uri, "", now},
	} {
		if err := VerifyAgentRequest(tc.key, tc.method, tc.uri, tc.tok, tc.at); !errors.Is(err, ErrAgentToken) {
			t.Errorf("%s: %v, want ErrAgentToken", tc.name, err)
		}
	}
}

func TestParseLogRequest(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  LogRequest
		bad   bool
	}{
		{"worker=3", LogRequest{Worker: 3, Tail: DefaultLogTail}, false},
		{"worker=0&link=dc-a&follow=true&tail=-1", LogRequest{Link: "dc-a", Follow: true, Tail: -1}, false},
		{"worker=1&previous=1&tail=5", LogRequest{Worker: 1, Previous: true, Tail: 5}, false},
		{"", LogRequest{}, true},
		{"worker=-2", LogRequest{}, true},
		{"worker=1&tail=many", LogRequest{}, true},
		{"worker=1&follow=perhaps", LogRequest{}, true},
		{"worker=1&follow=true&previous=true", LogRequest{}, true},
	} {
		q, _ := url.ParseQuery(tc.query)
		got, err := ParseLogRequest(q)
		if tc.bad {
			if !errors.Is(err, ErrBadInput) {
				t.Errorf("%q: %v, want ErrBadInput", tc.query, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%q = %+v, %v; want %+v", tc.query, got, err, tc.want)
		}
		back, err := ParseLogRequest(got.Query())
		if err != nil || back != got {
			t.Errorf("%q: Query does not read back: %+v, %v", tc.query, back, err)
		}
	}
}

// FuzzReadEvents feeds the server-sent event reader anything: it returns an error or
// events, and never panics.
func FuzzReadEvents(f *testing.F) {
	f.Add("id: 1\ndata: {\"id\":1,\"kind\":\"node.lost\",\"object\":\"node/n1\"}\n\n: keepalive\n\n")
	f.Add("data: {\n\n")
	f.Add("data: " + string(make([]byte, 100)) + "\n\n")
	f.Fuzz(func(t *testing.T, s string) {
		_ = readEvents(stringsReader(s), func(e Event) error { return nil })
	})
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

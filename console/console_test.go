package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func get(t *testing.T, srv *httptest.Server, path string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestHandlerServesTheConsole(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("GET "+Prefix, Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tests := []struct {
		path, status, ctype, body string
	}{
		{"/ui/", "200", "text/html", `<script type="module" src="app.js">`},
		{"/ui/app.js", "200", "text/javascript", "import { API } from './api.js';"},
		{"/ui/style.css", "200", "text/css", ".cell"},
		{"/ui/favicon.svg", "200", "image/svg+xml", "<svg"},
		{"/ui/nope.js", "404", "", ""},
		{"/ui/%2e%2e/go.mod", "404", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			resp, body := get(t, srv, tt.path, nil)
			if got := resp.Status[:3]; got != tt.status {
				t.Fatalf("status %s, want %s", resp.Status, tt.status)
			}
			if !strings.HasPrefix(resp.Header.Get("Content-Type"), tt.ctype) {
				t.Errorf("Content-Type %q, want %s", resp.Header.Get("Content-Type"), tt.ctype)
			}
			if !strings.Contains(body, tt.body) {
				t.Errorf("body lacks %q", tt.body)
			}
			csp := resp.Header.Get("Content-Security-Policy")
			for _, want := range []string{"default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
				if !strings.Contains(csp, want) {
					t.Errorf("Content-Security-Policy %q lacks %q", csp, want)
				}
			}
			if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
				t.Error("no X-Content-Type-Options: nosniff")
			}
		})
	}
	// Revalidation: a file whose hash holds is answered 304.
	resp, _ := get(t, srv, "/ui/app.js", nil)
	tag := resp.Header.Get("ETag")
	if tag == "" || resp.Header.Get("Cache-Control") != "no-cache" {
		t.Fatalf("ETag %q, Cache-Control %q", tag, resp.Header.Get("Cache-Control"))
	}
	if resp, _ := get(t, srv, "/ui/app.js", map[string]string{"If-None-Match": tag}); resp.StatusCode != http.StatusNotModified {
		t.Errorf("revalidation answered %s, want 304", resp.Status)
	}
}

// TestAssetsFetchNothingElsewhere: no asset names another origin (a CDN, a font service),
// builds markup from strings, or runs code from strings.
func TestAssetsFetchNothingElsewhere(t *testing.T) {
	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9-]+\.[a-z0-9.-]+`)
	forbidden := []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "@import", "@font-face", "url(http"}
	n := 0
	err := fs.WalkDir(files, "ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		s := string(b)
		for _, m := range external.FindAllString(s, -1) {
			if m != "http://www.w3.org" { // the SVG namespace is a name, not a fetch
				t.Errorf("%s names another origin: %s", p, m)
			}
		}
		for _, f := range forbidden {
			if strings.Contains(s, f) {
				t.Errorf("%s uses %s", p, f)
			}
		}
		return nil
	})
	if err != nil || n < 6 {
		t.Fatalf("walked %d files: %v", n, err)
	}
}

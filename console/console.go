// Package console is the web console every master serves at /ui/: the cluster map, jobs,
// nodes, data centers, tenants and events, live from GET /v1/watch and GET /v1/events; a
// job's workers' logs, rollouts, history, spec and why; with actions through the API.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

// files are the console's assets, plain HTML, CSS and JavaScript written by hand: there is
// no build step, and nothing is fetched from anywhere but the master at run time.
//
//go:embed ui
var files embed.FS

// Prefix is where a master serves the console.
const Prefix = "/ui/"

// securityHeaders keep the console to its own files and its own master: no inline script
// or style, no other origin, no framing.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
		"connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	"X-Frame-Options":        "DENY",
}

// Handler serves the console under Prefix. Files are revalidated on every load (an
// upgraded master serves new ones at once) and answered 304 while their hash holds.
func Handler() http.Handler {
	sub, err := fs.Sub(files, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	etags := map[string]string{}
	_ = fs.WalkDir(sub, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(sub, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		etags[p] = `"` + hex.EncodeToString(sum[:8]) + `"`
		return nil
	})
	files := http.StripPrefix(strings.TrimSuffix(Prefix, "/"), http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		for k, v := range securityHeaders {
			h.Set(k, v)
		}
		h.Set("Cache-Control", "no-cache")
		name := strings.TrimPrefix(path.Clean("/"+strings.TrimPrefix(r.URL.Path, Prefix)), "/")
		if name == "" || name == "." {
			name = "index.html"
		}
		if tag, ok := etags[name]; ok {
			h.Set("ETag", tag)
		}
		files.ServeHTTP(w, r)
	})
}

// Package js holds the JavaScript client of this folder (the npm package
// @ssebus/eventbus-client: index.js, client.js, cursor.js, parser.js and
// index.d.ts),
// embedded, so that a Go daemon can serve the very files the package
// publishes, from its own binary, with no copy to keep in step. The demo
// daemon's viewer loads them this way (cmd/sessiond, GET
// /static/eventbus-client/index.js).
//
// The JavaScript files are the source: this package only embeds them, and
// a test checks that it embeds every file package.json publishes and every
// module they import.
package js

import (
	"embed"
	"io/fs"
	"net/http"
	"path"
)

//go:embed index.js client.js cursor.js parser.js index.d.ts
var files embed.FS

// FS returns the package's files, at the root of the file system:
// "index.js" (the entry point), "client.js", "cursor.js", "parser.js" and
// "index.d.ts".
// It is read-only and safe for concurrent use.
func FS() fs.FS { return files }

// Handler serves the package's files by name: GET or HEAD of "<prefix>/index.js"
// (after the caller strips its prefix, e.g. with http.StripPrefix) answers
// the file as text/javascript, with Cache-Control: no-cache (a browser
// revalidates, so a new daemon's client is never mixed with a cached one)
// and X-Content-Type-Options: nosniff. Any other path, a directory
// included, is 404; a method other than GET or HEAD is 405. Safe for
// concurrent use.
//
//	mux.Handle("GET /static/eventbus-client/", http.StripPrefix("/static/eventbus-client", js.Handler()))
//
// A page then imports "/static/eventbus-client/index.js"; the relative
// imports between the modules resolve under the same prefix.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		name := path.Clean("/" + r.URL.Path)[1:]
		if st, err := fs.Stat(files, name); name == "" || err != nil || st.IsDir() {
			http.NotFound(w, r)
			return
		}
		h := w.Header()
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		if path.Ext(name) == ".js" {
			// The type a browser requires of a module script, whatever the
			// machine's MIME table says.
			h.Set("Content-Type", "text/javascript; charset=utf-8")
		} else {
			h.Set("Content-Type", "text/plain; charset=utf-8")
		}
		http.ServeFileFS(w, r, files, name)
	})
}

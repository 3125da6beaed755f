// Package interop drives SSE clients nobody here wrote against the demo
// daemon cmd/sessiond, built and run as a process: tmaxmax/go-sse and
// r3labs/sse/v2 (Go), npm eventsource and npm eventsource-parser (Node, in
// node/, pinned by its package-lock.json), beside our own Go client,
// sseclient, as the reference reader that must see exactly what was
// published; sseclient also runs the other checks against the daemon
// (TestGoClientAgainstTheDaemon). README.md says what each one was shown to
// do, and what the Python clients do, read from their source.
//
// It is a module of its own so that the root module never depends on the
// clients. Run it with .ci/interop.sh, which installs Node and the npm
// packages first, or with
//
//	(cd node && npm ci) && go test -race -count=1 ./...
//
// The Node tests skip without node or node_modules, unless CI=true, where
// they fail.
package interop

// Package e2e holds end-to-end tests of the demo daemon cmd/sessiond in a real
// browser: Debian's chromium, driven with github.com/chromedp/chromedp.
//
// It is a module of its own so that the root module never depends on chromedp.
// Run it with
//
//	cd e2e && go test -race -count=1 ./...
//
// or with .ci/e2e.sh, which installs chromium first when it is missing. The
// tests skip when chromium is missing, unless CI=true, where they fail.
// Screenshots go to $E2E_ARTIFACTS, or to e2e/artifacts (ignored by git).
package e2e

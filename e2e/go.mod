module github.com/ssebus/eventbus/e2e

go 1.25

// Users get the root module at the release this file requires (one version
// for every module of the repository, RELEASING.md); inside the
// repository it builds against the working tree: a replace applies
// only to the main module.
replace github.com/ssebus/eventbus => ../

require (
	github.com/chromedp/cdproto v0.159.0
	github.com/chromedp/chromedp v0.23.0
	github.com/ssebus/eventbus v0.1.0
	go.uber.org/goleak v1.3.0
)

require github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect

package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/ssebus/eventbus"
)

// DemoSession is the session that -demo publishes to.
const DemoSession = "demo"

// Demo publishes a "tick" event to session DemoSession every Interval. Its
// data is {"n":N,"at":"<RFC 3339 UTC time>"}, N counting from 1, with
// "replica":Replica added when Replica is set.
type Demo struct {
	Interval time.Duration // > 0
	Replica  string        // optional: which replica publishes
	// Publish publishes ev to session; ctx is Run's context. Run logs an
	// error it returns at Warn ("demo publish failed"), so Publish returns
	// nil for an error not worth a log line (such as one caused by
	// shutdown). It is called on Run's goroutine, one call at a time, and
	// Run cannot return while a call blocks: it should honour ctx.
	Publish func(ctx context.Context, session string, ev eventbus.Event) error
	Logger  *slog.Logger // required
}

// Run blocks, publishing a tick every Interval, until ctx is done.
func (d *Demo) Run(ctx context.Context) {
	t := time.NewTicker(d.Interval)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			n++
			at := now.UTC().Format(time.RFC3339Nano)
			var data []byte
			if d.Replica == "" {
				data = fmt.Appendf(nil, `{"n":%d,"at":%q}`, n, at)
			} else {
				data = fmt.Appendf(nil, `{"n":%d,"at":%q,"replica":%q}`, n, at, d.Replica)
			}
			if err := d.Publish(ctx, DemoSession, eventbus.Event{Type: "tick", Data: json.RawMessage(data)}); err != nil {
				d.Logger.Warn("demo publish failed", "session", DemoSession, "err", err)
			}
		}
	}
}

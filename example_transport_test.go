package eventbus_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ssebus/eventbus"
)

// A transport of its own, written outside the package with exported API
// only, as the Handler is: take a batch into a reused slice, write each
// frame's shared encoding, flush, and report the batch once.
func ExampleSubscription_TakeReady() {
	bus, _ := eventbus.New(eventbus.Options{
		Now:          func() time.Time { return time.UnixMilli(1719000000000) },
		OnDiagnostic: func(eventbus.Diagnostic) bool { return true }, // no log lines in the example
	})
	defer bus.Close()
	sub, _ := bus.Subscribe(context.Background(), eventbus.SubscribeOptions{})
	defer sub.Close()
	_, _ = bus.Publish(eventbus.Event{Type: "greeting", Data: "hello"})
	_, _ = bus.Publish(eventbus.Event{Type: "greeting", Data: "again"})

	var conn bytes.Buffer // the transport's connection
	write := func(batch []eventbus.Frame) error {
		for _, f := range batch {
			conn.Write(f.SSE()) // shared bytes: written, never modified
		}
		return nil // a real transport flushes here, under a deadline
	}

	var batch []eventbus.Frame
	batch, open := sub.TakeReady(batch[:0]) // never blocks; wait on sub.Ready() when empty
	if err := write(batch); err != nil {
		sub.CloseBlocked(len(batch), err) // the batch and the queue count as dropped (blocked)
		return
	}
	sub.MarkWritten(len(batch)) // delivered only once written
	clear(batch)                // do not pin frames while idle

	fmt.Print(conn.String())
	fmt.Println("open:", open, "delivered:", bus.Stats().FramesDelivered)

	// A write that fails: the frames taken are reported as blocked.
	_, _ = bus.Publish(eventbus.Event{Type: "greeting", Data: "lost"})
	batch, _ = sub.TakeReady(batch[:0])
	sub.CloseBlocked(len(batch), errors.New("write: broken pipe"))
	fmt.Println("blocked:", bus.Stats().Dropped.Blocked)
	// Output:
	// id: 1
	// event: greeting
	// data: {"id":1,"v":1,"type":"greeting","data":"hello","_meta":{"serverTimestamp":1719000000000}}
	//
	// id: 2
	// event: greeting
	// data: {"id":2,"v":1,"type":"greeting","data":"again","_meta":{"serverTimestamp":1719000000000}}
	//
	// open: true delivered: 2
	// blocked: 1
}

package seam

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEnvelope(t *testing.T) {
	e := Encoded{Type: "t", Tail: []byte(`,"v":1,"type":"t"}`)}
	if got, want := string(e.Envelope(18446744073709551615)), `{"id":18446744073709551615,"v":1,"type":"t"}`; got != want {
		t.Fatalf("Envelope = %s, want %s", got, want)
	}
}

// mustPanic runs f and fails unless it panics.
func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s did not panic", what)
		}
	}()
	f()
}

type bus struct{ closed string }

// Lend and Borrow in a binary without package eventbus: Borrow panics
// until something is lent, returns what was lent for the same types, and
// panics for others; a second Lend panics.
func TestLendBorrow(t *testing.T) {
	defer func() { lent = nil }()
	mustPanic(t, "Borrow before Lend", func() { Borrow[*bus, int, string]() })
	Lend(Root[*bus, int, string]{CloseWithError: func(b *bus, kind, message string) error {
		b.closed = kind + ": " + message
		return nil
	}})
	b := &bus{}
	if err := Borrow[*bus, int, string]().CloseWithError(b, "unavailable", "down"); err != nil || b.closed != "unavailable: down" {
		t.Fatalf("the borrowed CloseWithError gave %v, %q", err, b.closed)
	}
	mustPanic(t, "Borrow of other types", func() { Borrow[*bus, string, string]() })
	mustPanic(t, "a second Lend", func() { Lend(Root[*bus, int, string]{}) })
}

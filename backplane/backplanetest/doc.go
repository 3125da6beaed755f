// Package backplanetest is the conformance suite of backplanes built on
// package backplane: a backplane module runs it from its own tests in one
// call, against its real engine, the way testing/fstest.TestFS checks an
// fs.FS:
//
//	func TestBackplane(t *testing.T) {
//		backplanetest.Run(t, backplanetest.Harness{
//			Start:             startCluster, // n replicas on one engine, a namespace of their own
//			ErrUnavailable:    mybus.ErrUnavailable,
//			ErrOutcomeUnknown: mybus.ErrOutcomeUnknown,
//			ErrInvalidSession: mybus.ErrInvalidSession,
//			TrimsBytes:        true,
//		})
//	}
//
// Each check is a subtest on a cluster of its own, named for the promise
// it tests: ids contiguous from 1 across replicas, one order on every
// replica, one epoch kept, the envelope, publish validation, the reserved
// types of the synthetic frames refused, the session id rule
// (eventbus.CheckSessionID, on every method), resumes on
// any replica (another one, behind a late mirror, while publishing, on a
// lagging replica), trims and ring_evicted, the replay budget, local
// evictions, signals, DELETE, idempotent publish (duplicates, keys,
// concurrency, the window, a retry across an outage), an engine outage
// (unavailable within the bound, then recovery) and a short one, a lost
// log, idle release, Close. A failure's message starts with
// "backplanetest: " and the promise the backplane broke, so that its
// author can fix the engine without reading the suite. Checks that need a
// control the harness does not give (Cluster.Gates, Down and Up, Lose)
// are skipped, saying which.
//
// The package also has what a backplane's own tests and benchmarks need:
// an SSE client (Open, Stream, Frame), in-process replicas behind HTTP
// servers (Replica), the readers' Gate, Env for an engine server a CI
// script starts, and the publish-to-delivery benchmark (Delivery). It
// imports only the standard library and the eventbus packages.
package backplanetest

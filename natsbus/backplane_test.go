package natsbus

import (
	"testing"

	"github.com/ssebus/eventbus/internal/backplanetest"
)

// TestBackplane runs the tests every backplane must pass
// (internal/backplanetest.Run): Close, resuming on another replica and
// behind a late mirror and while publishing, local eviction, the replay
// budget, signals.
func TestBackplane(t *testing.T) { backplanetest.Run(t, cluster) }

// Events published concurrently on all three replicas reach every
// subscriber on every replica, with the same ids, bytes and order.
func TestThreeReplicasOneOrder(t *testing.T) {
	srv := startServer(t)
	a, b, c := threeReplicas(t, srv.URL(), testOptions())
	backplanetest.ThreeReplicasOneOrder(t, a.shared, b.shared, c.shared)
}

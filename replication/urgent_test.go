package replication_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// urgentCounts is a memCounts that says when an add is urgent.
type urgentCounts struct {
	*memCounts
	urgent chan struct{}
}

func (u *urgentCounts) Urgent() <-chan struct{} { return u.urgent }

// TestUrgentPublishesBeforeFlush: with a flush interval of a minute, an add
// the counts call urgent reaches the other PoP of the region in well under a
// second, through the real NATS server and the durable layer's pass-through.
func TestUrgentPublishesBeforeFlush(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	slow := func(cfg *replication.Config) { cfg.FlushInterval = time.Minute }
	fra := &urgentCounts{memCounts: newMemCounts("fra1"), urgent: make(chan struct{}, 1)}
	db, err := replication.OpenDB(filepath.Join(t.TempDir(), "state"), "fra1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() }) // after the replicator's cleanup, which saves a last time
	var counts replication.Counts = replication.NewPersisted(fra, db, nil)
	if _, ok := counts.(replication.UrgentNotifier); !ok {
		t.Fatal("Persisted hides its counts' Urgent")
	}
	cfg := replication.Config{Region: "eu", POP: "fra1", Topology: topo, Conn: c.Connect(t, "eu"),
		Counts: counts, Domains: c.Domains(), Logger: testLogger(t)}
	slow(&cfg)
	runReplicator(t, cfg)
	par := startPoP(t, c, topo, "eu", "par1", nil, slow)
	time.Sleep(200 * time.Millisecond) // past the first, immediate flush

	fra.Add("k", w0, 7)
	fra.urgent <- struct{}{}
	took, err := waitFor(5*time.Second, func() error {
		if n := par.counts.State().Total("k", w0, nil); n != 7 {
			return fmt.Errorf("par1 holds %d of k", n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("par1 does not see fra1's urgent add after %v: %v", took, err)
	}
	t.Logf("urgent add seen after %v (flush interval 1m)", took)
	if took > 2*time.Second {
		t.Fatalf("urgent add took %v", took)
	}
}

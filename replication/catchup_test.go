package replication_test

import (
	"errors"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/crdt/crdttest"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// A PoP that starts after another published is caught up (CaughtUp closes)
// only once it has applied everything in its region's stream when it
// started: at that moment it knows the other PoP's counts exactly. A PoP on
// an empty stream is caught up at once.
func TestCaughtUp(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}})
	fra := startPoP(t, c, topo, "eu", "fra1", nil, nil)
	select {
	case <-fra.rep.CaughtUp():
	case <-time.After(5 * time.Second):
		t.Fatal("a PoP on an empty stream is not caught up after 5 s")
	}
	r := newRand(t)
	var o crdttest.Oracle
	for range 30 { // many batches: reading them takes a while
		addRandom(r, []*pop{fra}, 500, 100, &o)
		time.Sleep(120 * time.Millisecond) // a flush interval and a little
	}
	if _, err := waitFor(5*time.Second, func() error {
		if st := fra.rep.Stats(); st.PublishedBatches < 30 || st.RetrySlots > 0 {
			return errors.New("not yet")
		}
		return nil
	}); err != nil {
		t.Fatalf("fra1 has not published its 30 rounds: %+v", fra.rep.Stats())
	}

	par := startPoP(t, c, topo, "eu", "par1", nil, nil)
	select {
	case <-par.rep.CaughtUp():
	case <-time.After(10 * time.Second):
		applied, target := par.rep.CatchUp()
		t.Fatalf("par1 not caught up after 10 s: applied %d of %d", applied, target)
	}
	if err := converged(&o, par); err != nil {
		t.Errorf("par1 is caught up but does not know fra1's counts: %v", err)
	}
	if applied, target := par.rep.CatchUp(); target < 30 || applied < target {
		t.Errorf("par1 caught up at applied %d, target %d: want a target of at least the 30 batches published", applied, target)
	}
}

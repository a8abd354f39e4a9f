package replication_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/edgelimit/edgelimit/crdt/crdttest"
	"github.com/edgelimit/edgelimit/deploy/lab/faultnet"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// TestDirectPath: while the link the stream sources another region over is
// held up behind a lost segment, a PoP with a direct connection to that
// region's server (Config.Direct) hears the slots of its keys near their
// limit (HotCounts) within a flush or so — and of the others only when the
// link delivers, as a PoP of the same region without a direct path hears
// them all. Every PoP ends with the exact counts: what arrived twice was
// joined twice.
func TestDirectPath(t *testing.T) {
	c := natstest.StartRegions(t, "eu", "us")
	topo := topology(map[string][]string{"eu": {"fra1"}, "us": {"iad1", "sfo1"}})
	// The direct connection runs over its own TCP connection to eu's server,
	// not over the leaf link between the regions.
	_, url := c.ClientProxy(t, "eu")
	dc, err := nats.Connect(url, nats.Name("iad1 direct to eu"), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dc.Close)
	fraCounts := newMemCounts("fra1")
	fraCounts.hot = func(key string) bool { return key != "cold" }
	fra := startPoP(t, c, topo, "eu", "fra1", fraCounts, nil)
	iad := startPoP(t, c, topo, "us", "iad1", nil, func(cfg *replication.Config) {
		cfg.Direct = map[string]*nats.Conn{"eu": dc}
	})
	sfo := startPoP(t, c, topo, "us", "sfo1", nil, nil)

	var o crdttest.Oracle
	add := func(key string, n uint64) {
		fra.counts.Add(key, w0, n)
		o.Add(key, w0, n)
	}
	add("k", 3)
	converge(t, 3*time.Second, &o, fra, iad, sfo)

	// Every chunk on the leaf link is now lost once and sent again 3 s
	// later, with everything behind it.
	stall := 3 * time.Second
	if err := c.Link("us").SetLink(faultnet.Link{Loss: 1, Retransmit: stall}); err != nil {
		t.Fatal(err)
	}
	stalledAt := time.Now()
	add("k", 4)
	add("j", 5)
	var hot crdttest.Oracle // what iad1 hears at once: the hot keys
	hot.Add("k", w0, 7)
	hot.Add("j", w0, 5)
	add("cold", 6)
	took, err := waitFor(time.Second, func() error {
		st := iad.counts.State()
		for _, k := range []string{"k", "j"} {
			if got, want := st.Total(k, w0, nil), hot.Sum(k, w0); got != want {
				return fmt.Errorf("key %s: %d, want %d", k, got, want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("iad1 (direct path) did not hear the hot keys within %v: %v", took, err)
	}
	t.Logf("iad1 (direct) heard the hot keys %v after the adds", took)
	if got := iad.counts.State().Total("cold", w0, nil); got != 0 {
		t.Errorf("iad1 heard %d of key cold, which is not hot, during the stall: it should come only by the stream", got)
	}
	if err := converged(&o, sfo); err == nil {
		t.Fatalf("sfo1 (no direct path) converged within %v of a %v stall: the link was not held up", time.Since(stalledAt), stall)
	}
	c.Link("us").Delay(0)
	converge(t, 2*stall, &o, sfo, iad)
	t.Logf("sfo1 (stream only) converged %v after the stall began", time.Since(stalledAt))
	if st := iad.rep.Stats(); st.DirectBatches == 0 || st.DroppedTotal() != 0 {
		t.Errorf("iad1: %d batches taken on the direct path, %d dropped; want some and none", st.DirectBatches, st.DroppedTotal())
	}
	if st := fra.rep.Stats(); st.HotBatches == 0 {
		t.Error("fra1 published no batch of hot slots")
	}
	converge(t, time.Second, &o, fra, iad, sfo)
}

// TestDirectConfig: a direct path must name another region of the topology,
// with a connection.
func TestDirectConfig(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	nc := c.Connect(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1"}, "us": {"iad1"}})
	for _, tc := range []struct {
		direct map[string]*nats.Conn
		want   string
	}{
		{map[string]*nats.Conn{"eu": nc}, "own region"},
		{map[string]*nats.Conn{"ap": nc}, "not in the topology"},
		{map[string]*nats.Conn{"us": nil}, "no connection"},
	} {
		_, err := replication.New(replication.Config{Region: "eu", POP: "fra1", Topology: topo, Conn: nc,
			Counts: newMemCounts("fra1"), Direct: tc.direct})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Direct %v: err %v, want one saying %q", tc.direct, err, tc.want)
		}
	}
	if _, err := replication.New(replication.Config{Region: "eu", POP: "fra1", Topology: topo, Conn: nc,
		Counts: newMemCounts("fra1"), Direct: map[string]*nats.Conn{"us": nc}}); err != nil {
		t.Errorf("a direct path to another region of the topology: %v", err)
	}
}

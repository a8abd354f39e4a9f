package replication_test

import (
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// TestBeaconsReachCounts: over real NATS, every PoP's presence beacons reach
// the other PoPs' counts (replication.BeaconCounts) — the store tells a
// quiet PoP from a held-up one by them — also through Persisted, and only
// the other PoPs': a PoP does not hear its own.
func TestBeaconsReachCounts(t *testing.T) {
	topo := topology(map[string][]string{"eu": {"fra1"}, "us": {"iad1"}})
	c := natstest.StartRegions(t, "eu", "us")
	fast := func(cfg *replication.Config) { cfg.HelloInterval = 50 * time.Millisecond }
	fra := newMemCounts("fra1")
	db, err := replication.OpenDB(t.TempDir(), "iad1", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	iad := newMemCounts("iad1")
	startPoP(t, c, topo, "eu", "fra1", fra, fast)
	runReplicator(t, replication.Config{Region: "us", POP: "iad1", Topology: topo, Conn: c.Connect(t, "us"),
		Counts: replication.NewPersisted(iad, db, nil), Domains: c.Domains(), Logger: testLogger(t), HelloInterval: 50 * time.Millisecond})
	deadline := time.Now().Add(5 * time.Second)
	for fra.beaconsOf("iad1") < 3 || iad.beaconsOf("fra1") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("beacons heard after 5 s: fra1 of iad1 %d, iad1 (through Persisted) of fra1 %d; want 3 each",
				fra.beaconsOf("iad1"), iad.beaconsOf("fra1"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := fra.beaconsOf("fra1") + iad.beaconsOf("iad1"); n != 0 {
		t.Fatalf("%d beacons of a PoP's own heard", n)
	}
}

package replication_test

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	edgelimitpb "github.com/edgelimit/edgelimit/proto"
	"github.com/edgelimit/edgelimit/replication"
	"github.com/edgelimit/edgelimit/replication/natstest"
)

// probeBounds bounds every key alike, as pop.ReplicaBounds does a key of a
// limit of 100 per minute (BoundFactor 4) without a mitigation duration.
type probeBounds struct{}

func (probeBounds) MaxCount(string) uint64      { return 400 }
func (probeBounds) MaxBit(string) time.Duration { return 2*time.Minute + time.Second }

// TestForgedReplication re-runs the replication probes of issue 12 against
// real NATS, as someone who can publish on the subjects would (no
// credentials here: what the receiver checks is the defence in depth behind
// TestPerPoPCredentials): a count of 2^40 "from par1", a delta from a
// replica outside the topology, a bit ending 100 years out, a beacon naming a
// cut-off region, and beacons that skip numbers every time. fra1 clamps,
// rejects and counts each (Stats.Rejected), and publishes a bounded number
// of snapshots.
func TestForgedReplication(t *testing.T) {
	c := natstest.StartRegions(t, "eu")
	topo := topology(map[string][]string{"eu": {"fra1", "par1"}, "us": {"iad1"}})
	bits := &memBits{pop: "fra1"}
	const snapIv, helloIv = 2 * time.Second, 100 * time.Millisecond
	fra := startPoP(t, c, topo, "eu", "fra1", nil, func(cfg *replication.Config) {
		cfg.Bits, cfg.Bounds = bits, probeBounds{}
		cfg.SnapshotInterval, cfg.HelloInterval = snapIv, helloIv
		cfg.UnreachableAfter = 3 * helloIv
		cfg.Domains = nil
	})
	fra.counts.Add("own", w0, 1) // something to snapshot
	nc := c.Connect(t, "eu")
	now := time.Now()

	big := &edgelimitpb.DeltaBatch{Replica: "par1", Region: "eu", Seq: 1, SentUnixNano: now.UnixNano()}
	big.Add([]byte("k"), w0, 1<<40)
	outsider := &edgelimitpb.DeltaBatch{Replica: "evil9", Region: "eu", Seq: 1, SentUnixNano: now.UnixNano()}
	outsider.Add([]byte("x"), w0, 50)
	century := now.Add(100 * 365 * 24 * time.Hour).UnixNano()
	bitBatch := &edgelimitpb.MitigationBatch{Replica: "par1", Bits: []*edgelimitpb.MitigationBit{
		{Key: []byte("k"), Scope: scopeGlobal, UntilUnixNano: century, Origin: "par1", IssuedUnixNano: now.UnixNano()}}}
	publishRaw(t, nc, replication.DeltaSubject("eu", "par1"), marshal(t, big))
	publishRaw(t, nc, replication.DeltaSubject("eu", "evil9"), marshal(t, outsider))
	publishRaw(t, nc, replication.BitsSubject("eu", "par1"), marshal(t, bitBatch))

	var want [replication.NumRejectReasons]uint64
	want[replication.RejectCount], want[replication.RejectReplica], want[replication.RejectBitEnd] = 1, 1, 1
	if _, err := waitFor(3*time.Second, func() error {
		if got := fra.rep.Stats().Rejected; got != want {
			return fmt.Errorf("rejected %v, want %v", got, want)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	st := fra.counts.State()
	if n := st.Total("k", w0, nil); n != 400 {
		t.Errorf("2^40 from par1: fra1 counts %d, want the bound 400", n)
	}
	if n := st.Total("x", w0, nil); n != 0 {
		t.Errorf("delta from evil9: fra1 counts %d, want 0", n)
	}
	b, ok := bits.Get("k", scopeGlobal)
	if !ok {
		t.Fatal("fra1 has no bit on k")
	}
	most := probeBounds{}.MaxBit("k")
	if d := time.Duration(b.Until - time.Now().UnixNano()); d > most {
		t.Errorf("100-year bit: holds %v more, want at most %v", d, most)
	}

	// us is cut off (iad1 never spoke); a beacon naming region us from
	// par1's name does not bring it back.
	if _, err := waitFor(2*time.Second, func() error {
		if got := fra.rep.Unreachable(time.Now(), 3*helloIv); len(got) != 1 {
			return fmt.Errorf("unreachable %v", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// par1's beacons skip a number every time, for two snapshot intervals,
	// and one in three names region us.
	snaps := fra.rep.Stats().PublishedSnapshots
	seq := uint64(time.Now().UnixNano())
	end := time.Now().Add(2 * snapIv)
	for i := 0; time.Now().Before(end); i++ {
		seq += 2
		subject := "edgelimit._hello.eu.par1"
		if i%3 == 0 {
			subject = "edgelimit._hello.us.par1"
		}
		if err := nc.Publish(subject, binary.AppendUvarint(nil, seq)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(helloIv / 2)
		if got := fra.rep.Unreachable(time.Now(), 3*helloIv); len(got) != 1 {
			t.Fatalf("a beacon naming region us from par1 made it reachable: unreachable %v", got)
		}
	}
	sent := fra.rep.Stats().PublishedSnapshots - snaps
	// The periodic two or three, the new PoP's, and the gap budget of two at
	// once and one per interval (core.missed).
	if sent > 7 {
		t.Errorf("%d snapshot messages in %v of gapped beacons, want at most 7", sent, 2*snapIv)
	}
	t.Logf("probe results at fra1: k=%d (sent 2^40), x from evil9=%d, bit on k holds %v more (sent 100 years), %d snapshots in %v of gapped beacons every %v, rejected %v",
		st.Total("k", w0, nil), st.Total("x", w0, nil), time.Duration(b.Until-time.Now().UnixNano()).Round(time.Second), sent, 2*snapIv, helloIv/2, fra.rep.Stats().Rejected)
}

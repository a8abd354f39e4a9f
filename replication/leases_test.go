package replication

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/edgelimit/edgelimit/crdt"
)

func leaseBytes(b byte) []byte { return bytes.Repeat([]byte{b}, 16) }

type savedLease struct {
	keys [][]byte
	exps []int64
}

func loadLeases(t *testing.T, db *DB, now int64) (map[string]savedLease, int) {
	t.Helper()
	got := map[string]savedLease{}
	n, expired, err := db.LoadLeases(now, func(id []byte, keys [][]byte, exps []int64) {
		var l savedLease
		for i := range keys {
			l.keys = append(l.keys, append([]byte(nil), keys[i]...))
			l.exps = append(l.exps, exps[i])
		}
		got[string(id)] = l
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != len(got) {
		t.Fatalf("LoadLeases reported %d, restored %d", n, len(got))
	}
	return got, expired
}

// Every synced lease grant survives a power loss, whatever happened to the
// unsynced data; a forgotten lease is gone, and leases expired at the load
// are deleted, not restored. Saved counts load as before beside the leases.
func TestLeasesSurvivePowerLoss(t *testing.T) {
	fs := vfs.NewCrashableMem()
	db := durableOpen(t, "db", "fra1", &DBOptions{FS: fs})
	if err := db.SaveFlush([]crdt.Slot{durableSlot("k", durableW1, "fra1", 3)}, nil, 7); err != nil {
		t.Fatal(err)
	}
	a, b, c := leaseBytes(1), leaseBytes(2), leaseBytes(3)
	k1, k2 := leaseBytes(0xa1), leaseBytes(0xa2)
	for _, l := range []struct {
		id   []byte
		keys [][]byte
		exps []int64
	}{
		{a, [][]byte{k1, k2}, []int64{100, 200}},
		{b, [][]byte{k1}, []int64{300}},
		{c, [][]byte{k2}, []int64{40}},
	} {
		if err := db.SaveLease(l.id, l.keys, l.exps); err != nil {
			t.Fatal(err)
		}
	}
	db.ForgetLease(b)
	crashed := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(1, 2))})
	db.Close()
	db = durableOpen(t, "db", "fra1", &DBOptions{FS: crashed})
	defer db.Close()
	got, expired := loadLeases(t, db, 50)
	la, ok := got[string(a)]
	if !ok || len(la.keys) != 2 || !bytes.Equal(la.keys[0], k1) || !bytes.Equal(la.keys[1], k2) || la.exps[0] != 100 || la.exps[1] != 200 {
		t.Fatalf("lease a after power loss: %+v (ok %v), want keys a1, a2 until 100, 200", la, ok)
	}
	if _, ok := got[string(c)]; ok || expired != 1 {
		t.Fatalf("lease c, expired at the load: restored %v, %d deleted; want not restored, 1 deleted", ok, expired)
	}
	// b was forgotten unsynced: it may or may not be back, never anything else.
	if lb, ok := got[string(b)]; ok && (len(lb.exps) != 1 || lb.exps[0] != 300) {
		t.Fatalf("lease b: %+v", lb)
	}
	if own, _, seq, err := db.Load(); err != nil || len(own) != 1 || seq != 7 {
		t.Fatalf("Load beside leases: %v, seq %d, %v", own, seq, err)
	}
	if n, err := db.DropExpiredLeases(250); err != nil || n != 1 {
		t.Fatalf("DropExpiredLeases(250) = %d, %v; want a's record (every slot expired)", n, err)
	}
	if got, _ := loadLeases(t, db, 250); len(got) > 1 {
		t.Fatalf("after DropExpiredLeases: %d leases", len(got))
	}
}

// Malformed grants are refused, naming the lease.
func TestSaveLeaseErrors(t *testing.T) {
	db := durableOpen(t, t.TempDir(), "fra1", nil)
	defer db.Close()
	for _, c := range []struct {
		id   []byte
		keys [][]byte
		exps []int64
	}{
		{[]byte{1}, [][]byte{leaseBytes(1)}, []int64{1}},
		{leaseBytes(1), [][]byte{leaseBytes(1)}, nil},
		{leaseBytes(1), [][]byte{{1, 2}}, []int64{1}},
	} {
		if err := db.SaveLease(c.id, c.keys, c.exps); err == nil {
			t.Errorf("SaveLease(%x, %x, %v) = nil, want an error", c.id, c.keys, c.exps)
		}
	}
}

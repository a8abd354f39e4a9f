package quota_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/edgelimit/edgelimit/pop/quota"
	"github.com/edgelimit/edgelimit/pop/rules"
)

// snapQuotas is a set of quotas that uses every field of the binary form.
func snapQuotas() []*quota.Quota {
	at := time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	timed := mkQuota("timed", "enterprise", quota.Override{Descriptor: "api_key.endpoint=POST /api/v1/orders", RequestsPerUnit: 0, Unit: rules.Second})
	timed.EffectiveAt, timed.ExpiresAt, timed.UpdatedAt = quota.TimeOf(at), quota.TimeOf(at.Add(time.Hour)), quota.TimeOf(at.Add(-time.Minute))
	old := mkQuota("old", "pro")
	old.EffectiveAt = quota.TimeOf(time.Unix(-5, 0)) // before 1970: a negative varint
	return []*quota.Quota{
		mkQuota("a", ""),
		mkQuota("key-0001", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: quota.MaxRequestsPerUnit, Unit: rules.Day}),
		mkQuota("key-0002", "pro", quota.Override{Descriptor: "tier:pro", RequestsPerUnit: 7, Unit: rules.Minute},
			quota.Override{Descriptor: "api_key.endpoint=GET /", RequestsPerUnit: 1, Unit: rules.Hour}),
		timed, old,
		mkQuota(strings.Repeat("k", quota.MaxKeyBytes), "free"),
	}
}

// data is a quota's fields, without the memo a compare must not see, its
// overrides in descriptor order (their order means nothing).
func data(qs []*quota.Quota) []quota.Quota {
	out := make([]quota.Quota, len(qs))
	for i, q := range qs {
		c := q.Clone()
		if len(c.Overrides) == 0 {
			c.Overrides = nil
		}
		slices.SortFunc(c.Overrides, func(a, b quota.Override) int { return strings.Compare(a.Descriptor, b.Descriptor) })
		out[i] = quota.Quota{APIKey: c.APIKey, Tier: c.Tier, Overrides: c.Overrides, EffectiveAt: c.EffectiveAt, ExpiresAt: c.ExpiresAt, UpdatedAt: c.UpdatedAt}
	}
	return out
}

func encode(t testing.TB, version int64, qs []*quota.Quota) []byte {
	var b bytes.Buffer
	if err := quota.EncodeSnapshotForTest(&b, version, qs); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// A binary snapshot reads back as written, through a file, and an empty
// one too.
func TestSnapshotRoundTrip(t *testing.T) {
	for name, qs := range map[string][]*quota.Quota{"quotas": snapQuotas(), "empty": nil} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "snap.bin")
			if err := quota.WriteSnapshotForTest(path, 42, qs); err != nil {
				t.Fatal(err)
			}
			got, v, err := quota.ReadSnapshot(path)
			if err != nil || v != 42 || !reflect.DeepEqual(data(got), data(qs)) {
				t.Fatalf("read back version %d, err %v:\n got %+v\nwant %+v", v, err, data(got), data(qs))
			}
		})
	}
}

// Any torn write (every truncation) and any flipped byte of a binary
// snapshot is refused as damaged, with no quotas and no panic.
func TestSnapshotDamage(t *testing.T) {
	b := encode(t, 9, snapQuotas())
	path := filepath.Join(t.TempDir(), "snap.bin")
	check := func(what string, file []byte) {
		t.Helper()
		if err := os.WriteFile(path, file, 0o644); err != nil {
			t.Fatal(err)
		}
		qs, _, err := quota.ReadSnapshot(path)
		if qs != nil || err == nil || !strings.Contains(err.Error(), path) {
			t.Fatalf("%s: %d quotas, error %v; want none and an error naming the file", what, len(qs), err)
		}
		// A file whose magic is cut or altered is no binary snapshot: the
		// JSON reader refuses it instead, naming the file too.
		if bytes.HasPrefix(file, []byte("ELQSNAP\n")) && !errors.Is(err, quota.ErrSnapshotDamaged) {
			t.Fatalf("%s: %v, want ErrSnapshotDamaged", what, err)
		}
	}
	for n := range len(b) {
		check("truncated to "+strconv.Itoa(n), b[:n])
	}
	for i := range b {
		for _, bit := range []byte{0x01, 0x80} {
			c := bytes.Clone(b)
			c[i] ^= bit
			check("byte "+strconv.Itoa(i)+" flipped", c)
		}
	}
	check("a byte appended", append(bytes.Clone(b), 0))
}

// A PoP upgraded from a release that saved its PostgreSQL snapshot as JSON
// lines starts from that file while PostgreSQL is down, and its next save
// writes the binary form with the same quotas: nothing is lost across the
// upgrade.
func TestSnapshotJSONStillRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "quotas-snapshot")
	qs := snapQuotas()
	if err := quota.WriteSnapshotJSONForTest(path, 17, qs); err != nil {
		t.Fatal(err)
	}
	down, err := quota.NewPostgres("postgres://postgres@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	idx := &quota.Index{}
	if err := (&quota.Syncer{Store: down, Index: idx, SnapshotPath: path}).Start(context.Background(), time.Second); err != nil {
		t.Fatal(err)
	}
	if idx.Len() != len(qs) || idx.Version() != 17 || idx.Get("key-0002").Override("tier:pro").RequestsPerUnit != 7 {
		t.Fatalf("from the JSON snapshot: %d quotas at version %d", idx.Len(), idx.Version())
	}
	if err := quota.WriteSnapshotForTest(path, idx.Version(), idx.All()); err != nil {
		t.Fatal(err)
	}
	got, v, err := quota.ReadSnapshot(path)
	if err != nil || v != 17 || len(got) != len(qs) {
		t.Fatalf("binary after the JSON: %d quotas at %d, %v", len(got), v, err)
	}
	byKey := map[string]*quota.Quota{}
	for _, q := range got {
		byKey[q.APIKey] = q
	}
	for _, q := range qs {
		if !reflect.DeepEqual(data([]*quota.Quota{byKey[q.APIKey]}), data([]*quota.Quota{q})) {
			t.Fatalf("%s changed across the upgrade: %+v", q.APIKey, byKey[q.APIKey])
		}
	}
}

// FuzzSnapshotBody feeds the binary decoder bodies that pass the checksum
// (the checksum would stop nearly every mutation before the decoder). Bad
// input must give an error, never a panic; a body it accepts must hold
// valid quotas and survive a round trip unchanged.
func FuzzSnapshotBody(f *testing.F) {
	for _, qs := range [][]*quota.Quota{snapQuotas(), nil, snapQuotas()[:1]} {
		b := encode(f, 3, qs)
		f.Add(b[:len(b)-4])
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		qs, v, err := quota.DecodeSnapshotBodyForTest(body)
		if err != nil {
			if qs != nil {
				t.Fatalf("an error (%v) with %d quotas", err, len(qs))
			}
			return
		}
		for _, q := range qs {
			if err := q.Validate(); err != nil {
				t.Fatalf("accepted an invalid quota %+v: %v", q, err)
			}
		}
		again := encode(t, v, qs)
		qs2, v2, err := quota.DecodeSnapshotBodyForTest(again[:len(again)-4])
		if err != nil || v2 != v || !reflect.DeepEqual(data(qs2), data(qs)) {
			t.Fatalf("round trip: version %d→%d, err %v\n got %+v\nwant %+v", v, v2, err, data(qs2), data(qs))
		}
	})
}

package replication

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/crdt/crdttest"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
)

// randomOwnSlots returns n distinct own slots of replica over two windows,
// with keys of 1 to 60 bytes and counts of every varint size.
func randomOwnSlots(r *rand.Rand, replica string, n int) []crdt.Slot {
	seen := make(map[[2]string]bool)
	out := make([]crdt.Slot, 0, n)
	for len(out) < n {
		key := strings.Repeat("k", r.IntN(50)) + strconv.Itoa(r.IntN(1_000_000))
		w := int64(1_700_000_040_000_000_000) + int64(r.IntN(2))*60e9
		id := [2]string{key, strconv.FormatInt(w, 10)}
		if seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, crdt.Slot{Key: key, Window: w, Replica: replica, Count: 1 + r.Uint64N(1<<uint(r.IntN(63)))})
	}
	return out
}

func sortedSlots(s []crdt.Slot) []crdt.Slot {
	s = slices.Clone(s)
	slices.SortFunc(s, crdt.CompareSlots)
	return s
}

// TestEncodeDeltas: whatever the size limit, the batches fit it, are
// numbered consecutively, decode to exactly the slots given, and a slot that
// fits no message is set aside instead of sent.
func TestEncodeDeltas(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	slots := randomOwnSlots(r, "fra1", 5000)
	huge := crdt.Slot{Key: strings.Repeat("x", 5000), Window: 1, Replica: "fra1", Count: 3}
	for _, limit := range []int{300, 4096, 64 << 10, 1 << 20} {
		t.Run("limit="+strconv.Itoa(limit), func(t *testing.T) {
			in := append(slices.Clone(slots), huge)
			r.Shuffle(len(in), func(i, j int) { in[i], in[j] = in[j], in[i] })
			chunks, oversized, err := collectDeltas(in, "fra1", "eu", 100, 42, limit)
			if err != nil {
				t.Fatal(err)
			}
			if limit < 5000 && (len(oversized) != 1 || oversized[0] != huge) {
				t.Fatalf("oversized = %v, want the huge slot", oversized)
			}
			want := slots
			if limit > 5100 {
				want = append(slices.Clone(slots), huge)
			}
			var got []crdt.Slot
			for i, c := range chunks {
				if len(c.data) > limit {
					t.Errorf("chunk %d is %d bytes, over the limit %d", i, len(c.data), limit)
				}
				if c.seq != 100+uint64(i) {
					t.Errorf("chunk %d has seq %d, want %d", i, c.seq, 100+i)
				}
				dec, sent, err := decodeDelta(c.data, "eu", "fra1")
				if err != nil {
					t.Fatalf("chunk %d: %v", i, err)
				}
				if sent != 42 {
					t.Errorf("chunk %d: sent %d, want 42", i, sent)
				}
				if !slices.Equal(sortedSlots(dec), sortedSlots(c.slots)) {
					t.Fatalf("chunk %d decodes to other slots than it says it carries", i)
				}
				got = append(got, dec...)
			}
			if err := crdttest.DiffSlots(sortedSlots(got), sortedSlots(want)); err != nil {
				t.Fatalf("decoded batches differ from the input: %v", err)
			}
			t.Logf("%d slots in %d batches", len(got), len(chunks))
		})
	}
	if _, _, err := collectDeltas(slots, "fra1", "eu", 1, 0, 10); err == nil {
		t.Error("a 10-byte limit encoded")
	}
}

// collectDeltas runs encodeDeltas and returns the chunks it emitted.
func collectDeltas(slots []crdt.Slot, replica, region string, seq uint64, sent int64, limit int) ([]deltaChunk, []crdt.Slot, error) {
	var chunks []deltaChunk
	oversized, err := encodeDeltas(slots, replica, region, seq, sent, limit, func(c deltaChunk) error {
		chunks = append(chunks, c)
		return nil
	})
	return chunks, oversized, err
}

// TestEncodeDeltasStops: an emit error stops the encoding and is returned;
// the chunks emitted before it and the slots left are the whole input.
func TestEncodeDeltasStops(t *testing.T) {
	slots := randomOwnSlots(rand.New(rand.NewPCG(5, 6)), "fra1", 1000)
	boom := errors.New("boom")
	var got []crdt.Slot
	_, err := encodeDeltas(slots, "fra1", "eu", 1, 0, 2048, func(c deltaChunk) error {
		if len(got) > 300 {
			return boom
		}
		got = append(got, c.slots...)
		return nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	rest := unsentSlots(slots, nil, len(got))
	if err := crdttest.DiffSlots(sortedSlots(append(got, rest...)), sortedSlots(slots)); err != nil {
		t.Fatal(err)
	}
}

// TestAppendDeltaBatch: the hand-written encoding is what proto.Unmarshal
// reads as the batch built with DeltaBatch.Add.
func TestAppendDeltaBatch(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	slots := sortedSlots(randomOwnSlots(r, "fra1", 200))
	slots = append(slots, crdt.Slot{Key: "", Window: 0, Replica: "fra1", Count: 9}, crdt.Slot{Key: "neg", Window: -60e9, Replica: "fra1", Count: 1})
	slices.SortStableFunc(slots, func(a, b crdt.Slot) int { return cmp.Compare(a.Window, b.Window) })
	for _, hdr := range []struct {
		replica, region string
		seq             uint64
		sent            int64
	}{{"fra1", "eu", 7, 1_700_000_000_000_000_000}, {"", "", 0, 0}, {"p", "r", 1 << 63, -5}} {
		want := &edgelimitpb.DeltaBatch{Replica: hdr.replica, Region: hdr.region, Seq: hdr.seq, SentUnixNano: hdr.sent}
		for _, s := range slots {
			want.Add([]byte(s.Key), s.Window, s.Count)
		}
		var got edgelimitpb.DeltaBatch
		if err := proto.Unmarshal(appendDeltaBatch(nil, hdr.replica, hdr.region, hdr.seq, hdr.sent, slots), &got); err != nil {
			t.Fatal(err)
		}
		// Add leaves keys nil for an empty key, Unmarshal gives []byte{}.
		if !proto.Equal(&got, want) {
			t.Errorf("header %+v: decoded %v\nwant %v", hdr, &got, want)
		}
	}
}

// TestEncodeSnapshots: the same for snapshots.
func TestEncodeSnapshots(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	slots := randomOwnSlots(r, "fra1", 3000)
	for _, limit := range []int{400, 8192, 1 << 20} {
		t.Run("limit="+strconv.Itoa(limit), func(t *testing.T) {
			msgs, nslots, oversized, err := encodeSnapshots(slots, "fra1", "eu", 42, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(oversized) != 0 {
				t.Fatalf("%d oversized slots", len(oversized))
			}
			var got []crdt.Slot
			for i, m := range msgs {
				if len(m) > limit {
					t.Errorf("message %d is %d bytes, over the limit %d", i, len(m), limit)
				}
				dec, err := decodeSnapshot(m, "eu", "fra1", "someone-else")
				if err != nil {
					t.Fatal(err)
				}
				if len(dec) != nslots[i] {
					t.Errorf("message %d has %d slots, says %d", i, len(dec), nslots[i])
				}
				got = append(got, dec...)
				if own, _ := decodeSnapshot(m, "eu", "fra1", "fra1"); len(own) != 0 {
					t.Errorf("message %d: the reader's own slots were not skipped", i)
				}
			}
			if err := crdttest.DiffSlots(sortedSlots(got), sortedSlots(slots)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCodecFields: the hand-written codec found every field it needs in the
// generated descriptors, each with a one-byte tag, as its size estimates
// assume.
func TestCodecFields(t *testing.T) {
	for name, n := range map[string]protowire.Number{
		"DeltaBatch.replica": fBatchReplica, "DeltaBatch.region": fBatchRegion, "DeltaBatch.seq": fBatchSeq,
		"DeltaBatch.sent_unix_nano": fBatchSent, "DeltaBatch.windows": fBatchWindows,
		"DeltaBatch.required_revision": fBatchRequired, "WindowSlots.window": fGroupWindow,
		"WindowSlots.keys": fGroupKeys, "WindowSlots.counts": fGroupCounts,
	} {
		if n < 1 || n > 15 {
			t.Errorf("field %s has number %d, want 1 to 15", name, n)
		}
	}
}

func TestParseSubject(t *testing.T) {
	tests := []struct {
		subject, region, kind, pop string
		ok                         bool
	}{
		{"edgelimit.eu.delta.fra1", "eu", "delta", "fra1", true},
		{"edgelimit.eu-west.snapshot.par-1", "eu-west", "snapshot", "par-1", true},
		{"edgelimit.eu.whatever.fra1", "eu", "whatever", "fra1", true}, // kind checked by the caller
		{"edgelimit.eu.delta", "", "", "", false},
		{"edgelimit.eu.delta.fra1.x", "", "", "", false},
		{"edgelimit.eu", "", "", "", false},
		{"edgelimit..delta.fra1", "", "", "", false},
		{"other.eu.delta.fra1", "", "", "", false},
		{"", "", "", "", false},
	}
	for _, tt := range tests {
		region, kind, pop, ok := parseSubject(tt.subject)
		if region != tt.region || kind != tt.kind || pop != tt.pop || ok != tt.ok {
			t.Errorf("parseSubject(%q) = %q, %q, %q, %t; want %q, %q, %q, %t",
				tt.subject, region, kind, pop, ok, tt.region, tt.kind, tt.pop, tt.ok)
		}
	}
}

func TestValidToken(t *testing.T) {
	for _, ok := range []string{"eu", "eu-west-1", "FRA_1"} {
		if err := validToken("region", ok); err != nil {
			t.Errorf("validToken(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "_hello", "eu.west", "eu*", "eu>", "eu west", "eu/1", "é"} {
		if validToken("region", bad) == nil {
			t.Errorf("validToken(%q) = nil, want an error", bad)
		}
	}
}

// TestLagBuckets: every value falls in a bucket whose upper bound is at
// most 1/16 above it, and buckets are ordered.
func TestLagBuckets(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<22; v += 1 + v/64 {
		i := lagBucket(v)
		if i < prev {
			t.Fatalf("bucket of %d is %d, below the bucket %d of a smaller value", v, i, prev)
		}
		prev = i
		up := lagUpper(i)
		if up < v || float64(up) > float64(v)*(1+1.0/16)+1 {
			t.Fatalf("value %d in bucket %d with upper bound %d", v, i, up)
		}
	}
	if i := lagBucket(1 << 62); i != lagBuckets-1 {
		t.Errorf("huge value in bucket %d, want the last, %d", i, lagBuckets-1)
	}
}

func TestLagHistogram(t *testing.T) {
	var h lagHistogram
	if s := h.Stats(); s != (LagStats{}) {
		t.Errorf("empty histogram: %+v", s)
	}
	// 1..1000 ms, once each: p50 is 500 ms, p99 990 ms.
	for ms := 1; ms <= 1000; ms++ {
		h.Record(time.Duration(ms) * time.Millisecond)
	}
	h.Record(-time.Second) // clock skew counts as zero
	s := h.Stats()
	if s.Count != 1001 || s.Max != time.Second {
		t.Errorf("count %d max %v", s.Count, s.Max)
	}
	within := func(got, want time.Duration) bool {
		return got >= want && float64(got) <= float64(want)*(1+1.0/16)
	}
	if !within(s.P50, 500*time.Millisecond) || !within(s.P99, 990*time.Millisecond) {
		t.Errorf("p50 %v p99 %v, want 500ms and 990ms (up to 1/16 above)", s.P50, s.P99)
	}
}

// FuzzDecodeDelta: decodeDelta accepts exactly what proto.Unmarshal and
// Validate accept, with the same slots and sent time, and drops for the same
// reason.
func FuzzDecodeDelta(f *testing.F) {
	b := &edgelimitpb.DeltaBatch{Replica: "x1", Region: "eu", Seq: 1, SentUnixNano: 99}
	b.Add([]byte("k"), 60e9, 3)
	b.Add([]byte("k2"), -60e9, 1<<40)
	seed, _ := proto.Marshal(b)
	f.Add(seed)
	uneven := proto.Clone(b).(*edgelimitpb.DeltaBatch)
	uneven.Windows[0].Counts = append(uneven.Windows[0].Counts, 1)
	f.Add(must(proto.Marshal(uneven)))
	newer := proto.Clone(b).(*edgelimitpb.DeltaBatch)
	newer.RequiredRevision = 2
	f.Add(must(proto.Marshal(newer)))
	f.Add(appendDeltaBatch(nil, "x1", "eu", 3, 4, []crdt.Slot{{Key: "a", Window: 1, Count: 2}}))
	// Unpacked counts, an unknown field, a known field with another wire type.
	raw := protowire.AppendTag(nil, 1, protowire.BytesType)
	raw = protowire.AppendString(raw, "x1")
	raw = protowire.AppendTag(raw, 2, protowire.BytesType)
	raw = protowire.AppendString(raw, "eu")
	grp := protowire.AppendTag(nil, 2, protowire.BytesType)
	grp = protowire.AppendString(grp, "key")
	grp = protowire.AppendTag(grp, 3, protowire.VarintType)
	grp = protowire.AppendVarint(grp, 5)
	grp = protowire.AppendTag(grp, 9, protowire.Fixed64Type)
	grp = protowire.AppendFixed64(grp, 5)
	raw = protowire.AppendTag(raw, 5, protowire.BytesType)
	raw = protowire.AppendBytes(raw, grp)
	raw = protowire.AppendTag(raw, 3, protowire.BytesType)
	raw = protowire.AppendString(raw, "seq as bytes")
	f.Add(raw)
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, gotSent, err := decodeDelta(data, "eu", "x1")
		want, wantSent, wantErr := referenceDecodeDelta(data, "eu", "x1")
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("decodeDelta error %v, reference error %v", err, wantErr)
		}
		if err != nil {
			var a, b *decodeError
			if !errors.As(err, &a) || !errors.As(wantErr, &b) || a.reason != b.reason {
				t.Fatalf("decodeDelta error %v, reference error %v", err, wantErr)
			}
			if a.reason != DropDecode && a.Error() != b.Error() {
				t.Fatalf("decodeDelta error %q, reference error %q", a, b)
			}
			return
		}
		if gotSent != wantSent || !slices.Equal(got, want) {
			t.Fatalf("decodeDelta = %v, %d; reference %v, %d", got, gotSent, want, wantSent)
		}
	})
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// referenceDecodeDelta is decodeDelta written with the generated code, as
// proto/doc.go shows it.
func referenceDecodeDelta(data []byte, region, pop string) ([]crdt.Slot, int64, error) {
	var b edgelimitpb.DeltaBatch
	if err := proto.Unmarshal(data, &b); err != nil {
		return nil, 0, &decodeError{DropDecode, err}
	}
	if err := b.Validate(); err != nil {
		return nil, 0, &decodeError{validationReason(err), err}
	}
	if b.GetReplica() != pop || b.GetRegion() != region {
		return nil, 0, &decodeError{DropMismatch, fmt.Errorf("delta batch seq %d names %s/%s but came on the subject of %s/%s",
			b.GetSeq(), b.GetRegion(), b.GetReplica(), region, pop)}
	}
	slots := make([]crdt.Slot, 0, b.Len())
	b.Range(func(key []byte, window int64, count uint64) bool {
		slots = append(slots, crdt.Slot{Key: string(key), Window: window, Replica: b.GetReplica(), Count: count})
		return true
	})
	return slots, b.GetSentUnixNano(), nil
}

// FuzzDecode: no input makes a decoder panic, and whatever decodes carries
// only the sender's named replica (deltas) and never the reader's own
// replica (snapshots).
func FuzzDecode(f *testing.F) {
	b := &edgelimitpb.DeltaBatch{Replica: "x1", Region: "eu", Seq: 1}
	b.Add([]byte("k"), 60e9, 3)
	seed, _ := proto.Marshal(b)
	snap, _ := proto.Marshal(&edgelimitpb.Snapshot{Replica: "x1", Region: "eu", Replicas: []*edgelimitpb.ReplicaSlots{
		{Replica: "x1", Slots: []*edgelimitpb.Slot{{Key: []byte("k"), Window: 1, Count: 2}}},
		{Replica: "me", Slots: []*edgelimitpb.Slot{{Key: []byte("k"), Window: 1, Count: 2}}},
	}})
	f.Add(seed)
	f.Add(snap)
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if slots, _, err := decodeDelta(data, "eu", "x1"); err == nil {
			for _, s := range slots {
				if s.Replica != "x1" {
					t.Fatalf("delta slot of replica %q", s.Replica)
				}
			}
		}
		if slots, err := decodeSnapshot(data, "eu", "x1", "me"); err == nil {
			for _, s := range slots {
				if s.Replica == "me" {
					t.Fatal("snapshot slot of the reader's own replica")
				}
			}
		}
	})
}

// BenchmarkDeltaCodec is the cost of one 100k-slot flush of 30-byte keys:
// encoding it into messages of at most 1 MiB, and decoding them.
func BenchmarkDeltaCodec(b *testing.B) {
	slots := make([]crdt.Slot, 100_000)
	for i := range slots {
		slots[i] = crdt.Slot{Key: fmt.Sprintf("api_key=%022d", i), Window: 1_700_000_040_000_000_000, Replica: "fra1", Count: uint64(i%1000 + 1)}
	}
	b.Run("encode/slots=100000", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := collectDeltas(slots, "fra1", "eu", 1, 1, maxMessage-headerRoom); err != nil {
				b.Fatal(err)
			}
		}
	})
	chunks, _, _ := collectDeltas(slots, "fra1", "eu", 1, 1, maxMessage-headerRoom)
	b.Run("decode/slots=100000", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, c := range chunks {
				if _, _, err := decodeDelta(c.data, "eu", "fra1"); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

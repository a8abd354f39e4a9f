package edgelimitpb

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

var seed = flag.Uint64("seed", 0, "seed of the random messages (0: derive one from the clock and print it)")

// newRand returns a seeded source and logs the seed, so that a failure can be
// replayed with -seed.
func newRand(t testing.TB) *rand.Rand {
	s := *seed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -seed %d)", s, s)
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// messageTypes is every message of edgelimit.proto, top-level or not. A new
// message must be added here to be covered by the round-trip and fuzz tests;
// TestMessageTypesComplete checks that.
var messageTypes = []proto.Message{
	&Slot{},
	&WindowSlots{},
	&DeltaBatch{},
	&MitigationBit{},
	&MitigationBatch{},
	&ReplicaSlots{},
	&Snapshot{},
}

func TestMessageTypesComplete(t *testing.T) {
	msgs := File_edgelimit_proto.Messages()
	if msgs.Len() != len(messageTypes) {
		t.Fatalf("edgelimit.proto has %d messages, messageTypes lists %d", msgs.Len(), len(messageTypes))
	}
	for i := range msgs.Len() {
		want := msgs.Get(i).FullName()
		found := false
		for _, m := range messageTypes {
			found = found || m.ProtoReflect().Descriptor().FullName() == want
		}
		if !found {
			t.Errorf("messageTypes misses %s", want)
		}
	}
}

// fill sets every field of m to a random value, walking the descriptor so that
// fields added to edgelimit.proto later are covered without touching this
// test. Scalars are drawn from edge values half the time; strings are valid
// UTF-8, as proto3 requires; bytes are arbitrary. depth bounds nesting.
func fill(r *rand.Rand, m protoreflect.Message, depth int) {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if r.IntN(4) == 0 {
			continue // leave the field at its zero value
		}
		switch {
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range r.IntN(6) {
				if fd.Kind() == protoreflect.MessageKind {
					e := l.NewElement()
					if depth > 0 {
						fill(r, e.Message(), depth-1)
					}
					l.Append(e)
				} else {
					l.Append(scalar(r, fd))
				}
			}
		case fd.Kind() == protoreflect.MessageKind:
			if depth > 0 {
				fill(r, m.Mutable(fd).Message(), depth-1)
			}
		default:
			m.Set(fd, scalar(r, fd))
		}
	}
}

func scalar(r *rand.Rand, fd protoreflect.FieldDescriptor) protoreflect.Value {
	edge := r.IntN(2) == 0
	switch fd.Kind() {
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		if edge {
			return protoreflect.ValueOfInt64([]int64{0, 1, -1, math.MaxInt64, math.MinInt64, 1_700_000_000_000_000_000}[r.IntN(6)])
		}
		return protoreflect.ValueOfInt64(int64(r.Uint64()))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		if edge {
			return protoreflect.ValueOfUint64([]uint64{0, 1, 127, 128, math.MaxUint64}[r.IntN(5)])
		}
		return protoreflect.ValueOfUint64(r.Uint64() >> r.IntN(64))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(r.Uint32()))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		if edge {
			return protoreflect.ValueOfUint32([]uint32{0, 1, 2, math.MaxUint32}[r.IntN(4)])
		}
		return protoreflect.ValueOfUint32(r.Uint32())
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(edge)
	case protoreflect.StringKind:
		runes := []rune("fra1ams2-_. éü東京\U0001F600")
		s := make([]rune, r.IntN(12))
		for i := range s {
			s[i] = runes[r.IntN(len(runes))]
		}
		return protoreflect.ValueOfString(string(s))
	case protoreflect.BytesKind:
		b := make([]byte, r.IntN(40))
		for i := range b {
			b[i] = byte(r.Uint32()) // invalid UTF-8 included, on purpose
		}
		return protoreflect.ValueOfBytes(b)
	}
	panic(fmt.Sprintf("fill: no generator for %s field %s; add one", fd.Kind(), fd.FullName()))
}

// TestRoundTrip: for random messages of every type, Unmarshal(Marshal(m))
// equals m, and deterministic marshalling gives the same bytes twice.
func TestRoundTrip(t *testing.T) {
	r := newRand(t)
	for _, typ := range messageTypes {
		name := string(typ.ProtoReflect().Descriptor().Name())
		t.Run(name, func(t *testing.T) {
			for i := range 300 {
				m := typ.ProtoReflect().New()
				fill(r, m, 3)
				data, err := proto.Marshal(m.Interface())
				if err != nil {
					t.Fatalf("#%d: Marshal(%v): %v", i, m, err)
				}
				got := m.New().Interface()
				if err := proto.Unmarshal(data, got); err != nil {
					t.Fatalf("#%d: Unmarshal(Marshal(%v)): %v", i, m, err)
				}
				if !proto.Equal(got, m.Interface()) {
					t.Fatalf("#%d: round trip changed the message\n got %v\nwant %v", i, got, m)
				}
				d1, err1 := proto.MarshalOptions{Deterministic: true}.Marshal(got)
				d2, err2 := proto.MarshalOptions{Deterministic: true}.Marshal(m.Interface())
				if err1 != nil || err2 != nil || !bytes.Equal(d1, d2) {
					t.Fatalf("#%d: deterministic encodings differ (%v, %v)", i, err1, err2)
				}
			}
		})
	}
}

// TestKeysAreBytes: a key that is not valid UTF-8 decodes, while a replica
// name that is not valid UTF-8 is a decode error (and so a counted drop).
func TestKeysAreBytes(t *testing.T) {
	bad := []byte{0xff, 0xfe, 0x00, 0x80}
	b := &DeltaBatch{Replica: "fra1"}
	b.Add(bad, 1, 7)
	data, err := proto.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var got DeltaBatch
	if err := proto.Unmarshal(data, &got); err != nil {
		t.Fatalf("a non-UTF-8 key failed to decode: %v", err)
	}
	if !bytes.Equal(got.GetWindows()[0].GetKeys()[0], bad) {
		t.Fatalf("key = %x, want %x", got.GetWindows()[0].GetKeys()[0], bad)
	}

	// Field 1 (replica), wire type 2, with invalid UTF-8.
	raw := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), bad)
	if err := proto.Unmarshal(raw, &got); err == nil {
		t.Fatal("a non-UTF-8 replica name decoded without error")
	}
}

// TestUnknownFieldsPass: a field from a newer revision survives a decode and
// re-encode by this one, so a relay passes it on (rule 3).
func TestUnknownFieldsPass(t *testing.T) {
	newer := protowire.AppendTag(nil, 1, protowire.BytesType)
	newer = protowire.AppendString(newer, "fra1")
	newer = protowire.AppendTag(newer, 99, protowire.VarintType)
	newer = protowire.AppendVarint(newer, 42)
	var b DeltaBatch
	if err := proto.Unmarshal(newer, &b); err != nil {
		t.Fatal(err)
	}
	again, err := proto.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again, newer) {
		t.Fatalf("re-encoded %x, want %x", again, newer)
	}
}

func TestDeltaBatchAddRange(t *testing.T) {
	r := newRand(t)
	type slot struct {
		key    string
		window int64
	}
	want := map[slot]uint64{}
	var b DeltaBatch
	b.Replica = "fra1"
	for i := range 500 {
		s := slot{fmt.Sprintf("k%d", i), int64(r.IntN(3)) * int64(time.Minute)}
		want[s] = r.Uint64N(1000) + 1
		b.Add([]byte(s.key), s.window, want[s])
	}
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(b.Windows) > 3 {
		t.Errorf("3 distinct windows made %d groups", len(b.Windows))
	}
	data, err := proto.Marshal(&b)
	if err != nil {
		t.Fatal(err)
	}
	var got DeltaBatch
	if err := proto.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got.Len() != len(want) {
		t.Errorf("Len() = %d, want %d", got.Len(), len(want))
	}
	got.Range(func(key []byte, window int64, count uint64) bool {
		s := slot{string(key), window}
		if c, ok := want[s]; !ok || c != count {
			t.Errorf("Range gave %v = %d, want %d (present: %v)", s, count, c, ok)
		}
		delete(want, s)
		return true
	})
	if len(want) != 0 {
		t.Errorf("Range missed %d slots", len(want))
	}

	n := 0
	got.Range(func([]byte, int64, uint64) bool { n++; return n < 3 })
	if n != 3 {
		t.Errorf("Range went on after false: %d calls, want 3", n)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		msg     interface{ Validate() error }
		wantErr error // nil: valid; errAny: any error
	}{
		{"delta ok", &DeltaBatch{Replica: "a", Windows: []*WindowSlots{{Window: 1, Keys: [][]byte{{1}}, Counts: []uint64{1}}}}, nil},
		{"delta empty ok", &DeltaBatch{Replica: "a"}, nil},
		{"delta current revision ok", &DeltaBatch{Replica: "a", RequiredRevision: Revision}, nil},
		{"delta nil", (*DeltaBatch)(nil), errAny},
		{"delta no replica", &DeltaBatch{}, errAny},
		{"delta more keys", &DeltaBatch{Replica: "a", Windows: []*WindowSlots{{Keys: [][]byte{{1}, {2}}, Counts: []uint64{1}}}}, errAny},
		{"delta more counts", &DeltaBatch{Replica: "a", Windows: []*WindowSlots{{Keys: [][]byte{{1}}, Counts: []uint64{1, 2}}}}, errAny},
		{"delta nil group", &DeltaBatch{Replica: "a", Windows: []*WindowSlots{nil}}, errAny},
		{"delta newer", &DeltaBatch{Replica: "a", RequiredRevision: Revision + 1}, ErrNewerRevision},
		{"mitigation ok", &MitigationBatch{Replica: "a", Bits: []*MitigationBit{{Key: []byte{1}, Scope: 2}}}, nil},
		{"mitigation nil", (*MitigationBatch)(nil), errAny},
		{"mitigation no replica", &MitigationBatch{}, errAny},
		{"mitigation nil bit", &MitigationBatch{Replica: "a", Bits: []*MitigationBit{nil}}, errAny},
		{"mitigation newer", &MitigationBatch{Replica: "a", RequiredRevision: Revision + 1}, ErrNewerRevision},
		{"snapshot ok", &Snapshot{Replica: "a", Replicas: []*ReplicaSlots{{Replica: "a"}, {Replica: "b"}}}, nil},
		{"snapshot nil", (*Snapshot)(nil), errAny},
		{"snapshot no replica", &Snapshot{}, errAny},
		{"snapshot unnamed entry", &Snapshot{Replica: "a", Replicas: []*ReplicaSlots{{}}}, errAny},
		{"snapshot nil entry", &Snapshot{Replica: "a", Replicas: []*ReplicaSlots{nil}}, errAny},
		{"snapshot nil bit", &Snapshot{Replica: "a", Bits: []*MitigationBit{nil}}, errAny},
		{"snapshot newer", &Snapshot{Replica: "a", RequiredRevision: Revision + 1}, ErrNewerRevision},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.msg.Validate()
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("Validate() = %v, want nil", err)
			case tt.wantErr != nil && err == nil:
				t.Fatal("Validate() = nil, want an error")
			case tt.wantErr != nil && tt.wantErr != errAny && !errors.Is(err, tt.wantErr):
				t.Fatalf("Validate() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

var errAny = errors.New("any error")

// FuzzUnmarshal feeds arbitrary bytes to every message type. Decoding must
// never panic, nor Validate and Range on what decoded; and whatever decodes
// must re-encode to bytes that decode to an equal message.
func FuzzUnmarshal(f *testing.F) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, typ := range messageTypes {
		for range 4 {
			m := typ.ProtoReflect().New()
			fill(r, m, 2)
			data, err := proto.Marshal(m.Interface())
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0x2a, 0x05, 0x12, 0x01, 0xff, 0x1a, 0x00}) // a group with 1 key, 0 counts
	f.Add([]byte{0x0a, 0x02, 0xc3, 0x28})                   // replica with invalid UTF-8
	f.Add([]byte{0xf8, 0x06, 0x2a})                         // unknown field 111
	f.Add([]byte{0x78, 0x02})                               // required_revision 2

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, typ := range messageTypes {
			m := typ.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(data, m); err != nil {
				continue
			}
			switch v := m.(type) {
			case *DeltaBatch:
				_ = v.Validate()
				_ = v.Len()
				v.Range(func([]byte, int64, uint64) bool { return true })
			case *MitigationBatch:
				_ = v.Validate()
			case *Snapshot:
				_ = v.Validate()
			}
			again, err := proto.Marshal(m)
			if err != nil {
				t.Fatalf("%T decoded from %x but does not re-encode: %v", m, data, err)
			}
			m2 := typ.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(again, m2); err != nil {
				t.Fatalf("%T re-encoded as %x does not decode: %v", m, again, err)
			}
			if !proto.Equal(m, m2) {
				t.Fatalf("%T changed across re-encoding\nfirst  %v\nsecond %v", m, m, m2)
			}
		}
	})
}

// realisticBatch makes the slots of a busy flush interval: n slots over two
// windows (the current minute and, for a quarter of them, the previous one),
// 30-byte keys as rules.Limit.AppendKey builds them for
// domain "api", descriptor remote_address=<6 characters>, and small counts.
func realisticBatch(r *rand.Rand, n int) (keys [][]byte, windows []int64, counts []uint64) {
	const alphabet = "0123456789abcdefghijklmnopqrstuvwxyz"
	now := time.Date(2025, 11, 21, 14, 0, 0, 0, time.UTC).UnixNano()
	cur := now - now%int64(time.Minute)
	for range n {
		part := func(dst []byte, s string) []byte {
			return append(binary.AppendUvarint(dst, uint64(len(s))), s...)
		}
		var v [6]byte
		for i := range v {
			v[i] = alphabet[r.IntN(len(alphabet))]
		}
		k := part(nil, "api")
		k = part(k, "remote_address")
		k = part(k, string(v[:]))
		k = append(k, 0, 0, 1, 2) // algorithm, unit minute, scope global
		if len(k) != 30 {
			panic(len(k))
		}
		w := cur
		if r.IntN(4) == 0 {
			w -= int64(time.Minute)
		}
		keys = append(keys, k)
		windows = append(windows, w)
		counts = append(counts, 1+uint64(r.ExpFloat64()*40)) // mostly < 128: 1-byte varints, a tail of 2
	}
	return keys, windows, counts
}

// wireSizes returns the encoded size of the same n slots (with the same batch
// header) in three layouts:
//   - grouped: DeltaBatch as defined, windows of parallel keys and counts;
//   - naive: the header plus `repeated Slot slots = 5`, each slot carrying its
//     window;
//   - nested: windows of `repeated {bytes key = 1; uint64 count = 2;}`, that
//     is, grouped by window but one small message per slot.
//
// The naive and nested layouts are not in edgelimit.proto; their sizes are
// computed with protowire, exactly as the runtime would encode them.
func wireSizes(r *rand.Rand, n int) (grouped, naive, nested int, deflated int, b *DeltaBatch) {
	keys, windows, counts := realisticBatch(r, n)
	header := &DeltaBatch{Replica: "fra1", Region: "eu-central", Seq: 123456, SentUnixNano: time.Date(2025, 11, 21, 14, 0, 1, 0, time.UTC).UnixNano()}
	b = proto.Clone(header).(*DeltaBatch)
	for i := range keys {
		b.Add(keys[i], windows[i], counts[i])
	}
	data, err := proto.Marshal(b)
	if err != nil {
		panic(err)
	}
	grouped = len(data)

	naive = proto.Size(header)
	for i := range keys {
		s := proto.Size(&Slot{Key: keys[i], Window: windows[i], Count: counts[i]})
		naive += protowire.SizeTag(5) + protowire.SizeBytes(s)
	}

	nested = proto.Size(header)
	for _, w := range b.Windows {
		inner := protowire.SizeTag(1) + protowire.SizeVarint(uint64(w.Window))
		for i, k := range w.Keys {
			e := protowire.SizeTag(1) + protowire.SizeBytes(len(k)) + protowire.SizeTag(2) + protowire.SizeVarint(w.Counts[i])
			inner += protowire.SizeTag(2) + protowire.SizeBytes(e)
		}
		nested += protowire.SizeTag(5) + protowire.SizeBytes(inner)
	}

	var buf bytes.Buffer
	zw, _ := flate.NewWriter(&buf, flate.DefaultCompression)
	zw.Write(data)
	zw.Close()
	return grouped, naive, nested, buf.Len(), b
}

// TestWireSize measures the layout choice of DeltaBatch on a realistic batch
// (1000 slots, 30-byte keys, 2 windows) and fails if grouping by window stops
// paying.
func TestWireSize(t *testing.T) {
	const n = 1000
	grouped, naive, nested, deflated, _ := wireSizes(rand.New(rand.NewPCG(7, 7)), n)
	per := func(size int) float64 { return float64(size) / n }
	t.Logf("DeltaBatch, %d slots, 30-byte keys, 2 windows: bytes per slot on the wire", n)
	t.Logf("  grouped by window, parallel keys/counts (chosen): %6d B  %5.2f B/slot", grouped, per(grouped))
	t.Logf("  grouped by window, one {key, count} per slot:     %6d B  %5.2f B/slot", nested, per(nested))
	t.Logf("  naive repeated Slot {key, window, count}:         %6d B  %5.2f B/slot (+%.0f%%)", naive, per(naive), 100*float64(naive-grouped)/float64(grouped))
	t.Logf("  chosen layout after DEFLATE (for reference):     %6d B  %5.2f B/slot", deflated, per(deflated))
	if !(grouped < nested && nested < naive) {
		t.Errorf("grouped %d, nested %d, naive %d bytes: the chosen layout is no longer the smallest", grouped, nested, naive)
	}
}

func BenchmarkDeltaBatch(b *testing.B) {
	for _, n := range []int{10, 1000} {
		grouped, naive, _, _, batch := wireSizes(rand.New(rand.NewPCG(7, 7)), n)
		data, err := proto.Marshal(batch)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("Marshal/slots=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			var buf []byte
			for b.Loop() {
				buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], batch)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(grouped)/float64(n), "B/slot")
			b.ReportMetric(float64(naive)/float64(n), "naive-B/slot")
		})
		b.Run(fmt.Sprintf("Unmarshal/slots=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			var got DeltaBatch
			for b.Loop() {
				got.Reset()
				if err := proto.Unmarshal(data, &got); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

package escrow

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
)

var slotItems = []Item{
	{Kind: Count, Key: "api_key=abc", Window: 60 * sec, Spec: Spec{Limit: 100, Window: 60 * sec}, Replica: "fra1", Value: 42},
	{Kind: Requested, Key: "", Window: 0, Spec: Spec{Limit: 1, Window: 1, Sliding: true}, Replica: "a", Value: 0},
	{Kind: Give, Key: "\x00\x01\x02", Window: -sec, Spec: Spec{Limit: MaxLimit, Window: sec, Sliding: true},
		Replica: "ams-2", To: "fra_1", ToIncarnation: -5, Value: S},
	// A limit key that itself looks like an escrow slot stays a limit key.
	{Kind: Count, Key: "\x00\xe5\x03\x01\x01\x00", Window: 0, Spec: Spec{Limit: 1, Window: 1}, Replica: "b", Value: 1},
	{Kind: Give, Key: "\x05shop\x00", Window: 0, Spec: Spec{Limit: 5, Window: 1000}, Replica: "a",
		To: strings.Repeat("z", MaxName), ToIncarnation: 1<<63 - 1, Value: 7},
}

func TestSlotRoundTrip(t *testing.T) {
	for _, it := range slotItems {
		s := EncodeSlot(it)
		if !IsSlot(s) || !strings.HasSuffix(s.Key, it.Key) || s.Window != it.Window || s.Replica != it.Replica || s.Count != it.Value {
			t.Fatalf("EncodeSlot(%v) = %+v", it, s)
		}
		got, err := DecodeSlot(s)
		if err != nil || got != it {
			t.Fatalf("DecodeSlot(EncodeSlot(%v)) = %v, %v", it, got, err)
		}
	}
}

// TestSlotLayout pins the wire form byte by byte: it is read by other
// replicas, possibly of another version.
func TestSlotLayout(t *testing.T) {
	for _, tc := range []struct {
		it  Item
		key string
	}{
		{Item{Kind: Count, Key: "k", Spec: Spec{Limit: 100, Window: 1000}, Replica: "fra1", Value: 3},
			"\x00\xe5\x01\x64\xe8\x07\x00k"},
		{Item{Kind: Requested, Key: "", Spec: Spec{Limit: 1, Window: 1, Sliding: true}, Replica: "a", Value: 3},
			"\x00\xe5\x02\x01\x01\x01"},
		{Item{Kind: Give, Key: "\x03dom", Spec: Spec{Limit: 1, Window: 1, Sliding: true}, Replica: "a", To: "b", ToIncarnation: -5, Value: 3},
			"\x00\xe5\x03\x01\x01\x01\x01b\x09\x03dom"},
	} {
		s := EncodeSlot(tc.it)
		if want := (crdt.Slot{Key: tc.key, Replica: tc.it.Replica, Count: 3}); s != want {
			t.Errorf("EncodeSlot(%v) = %+q; want %+q", tc.it, s, want)
		}
	}
}

func TestDecodeSlotRejects(t *testing.T) {
	uv := func(v uint64) string { return string(binary.AppendUvarint(nil, v)) }
	for _, tc := range []struct {
		name    string
		key     string
		replica string // "a" when empty and noOwner is unset
		noOwner bool
		window  int64
		want    string // in the error
	}{
		{name: "an ordinary count", key: "\x03dom\x01k\x01v\x00\x01\x02\x01", want: "escrow mark"},
		{name: "empty key", key: "", want: "escrow mark"},
		{name: "first mark only", key: "\x00", want: "escrow mark"},
		{name: "wrong second mark", key: "\x00\xe4\x01\x01\x01\x00", want: "escrow mark"},
		{name: "kind missing", key: "\x00\xe5", want: "kind missing"},
		{name: "kind zero", key: "\x00\xe5\x00\x01\x01\x00", want: "unknown kind 0"},
		{name: "unknown kind", key: "\x00\xe5\x07\x01\x01\x00", want: "unknown kind 7"},
		{name: "limit missing", key: "\x00\xe5\x01", want: "limit is not a uvarint"},
		{name: "limit truncated", key: "\x00\xe5\x01\x81", want: "limit is not a uvarint"},
		{name: "limit overflows 64 bits", key: "\x00\xe5\x01" + strings.Repeat("\xff", 10) + "\x01\x01\x00", want: "limit is not a uvarint"},
		{name: "limit zero", key: "\x00\xe5\x01\x00\x01\x00", want: "limit 0"},
		{name: "limit over MaxLimit", key: "\x00\xe5\x01" + uv(MaxLimit+1) + "\x01\x00", want: "out of range"},
		{name: "window missing", key: "\x00\xe5\x01\x01", want: "window is not a uvarint"},
		{name: "window zero", key: "\x00\xe5\x01\x01\x00\x00", want: "window 0ns"},
		{name: "window past int64", key: "\x00\xe5\x01\x01" + uv(1<<63) + "\x00", want: "out of range"},
		{name: "flags missing", key: "\x00\xe5\x01\x01\x01", want: "flags missing"},
		{name: "unknown flag", key: "\x00\xe5\x01\x01\x01\x02", want: "unknown spec flags 0x2"},
		{name: "non-minimal limit", key: "\x00\xe5\x01\x81\x00\x01\x00", want: "canonical"},
		{name: "non-minimal window", key: "\x00\xe5\x01\x01\x81\x80\x00\x00", want: "canonical"},
		{name: "give without receiver", key: "\x00\xe5\x03\x01\x01\x00", want: "to length is not a uvarint"},
		{name: "give to past the end", key: "\x00\xe5\x03\x01\x01\x00\x05ab", want: "past the end"},
		{name: "give without incarnation", key: "\x00\xe5\x03\x01\x01\x00\x01b", want: "to incarnation is not a varint"},
		{name: "give to nobody", key: "\x00\xe5\x03\x01\x01\x00\x00\x00", want: "to: empty name"},
		{name: "give to itself", key: "\x00\xe5\x03\x01\x01\x00\x01a\x00", want: "gives to itself"},
		{name: "give to a name with a zero byte", key: "\x00\xe5\x03\x01\x01\x00\x02b\x00\x00", want: "zero byte"},
		{name: "non-minimal to length", key: "\x00\xe5\x03\x01\x01\x00\x81\x00b\x00", want: "canonical"},
		{name: "non-minimal incarnation", key: "\x00\xe5\x03\x01\x01\x00\x01b\x80\x00", want: "canonical"},
		{name: "no owner", key: "\x00\xe5\x01\x01\x01\x00", noOwner: true, want: "replica: empty name"},
		{name: "owner with a zero byte", key: "\x00\xe5\x01\x01\x01\x00", replica: "a\x00", want: "zero byte"},
		{name: "owner too long", key: "\x00\xe5\x01\x01\x01\x00", replica: strings.Repeat("a", MaxName+1), want: "more than 255"},
		{name: "window not aligned", key: "\x00\xe5\x01\x01\x0a\x00", window: 3, want: "not aligned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replica := tc.replica
			if replica == "" && !tc.noOwner {
				replica = "a"
			}
			s := crdt.Slot{Key: tc.key, Window: tc.window, Replica: replica, Count: 1}
			it, err := DecodeSlot(s)
			if !errors.Is(err, ErrBadSlot) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeSlot(%+q) = %v, %v; want ErrBadSlot saying %q", s, it, err, tc.want)
			}
		})
	}
}

// FuzzDecodeSlot: decoding never panics; it refuses what IsSlot refuses;
// whatever it accepts is valid and encodes back to the same slot; and an
// item built from the inputs that validates survives the round trip
// unchanged.
func FuzzDecodeSlot(f *testing.F) {
	for _, it := range slotItems {
		s := EncodeSlot(it)
		f.Add(s.Key, s.Window, s.Replica, s.Count, uint8(it.Kind), it.Spec.Limit, it.Spec.Window, it.Spec.Sliding, it.To, it.ToIncarnation)
	}
	f.Add("k", int64(0), "fra1", uint64(1), uint8(1), int64(1), int64(1), false, "", int64(0))
	f.Add("\x00\xe5\x01\x81\x00\x01\x00", int64(0), "a", uint64(1), uint8(3), int64(1), int64(1), true, "b", int64(-1))
	f.Fuzz(func(t *testing.T, key string, window int64, replica string, value uint64,
		kind uint8, limit, win int64, sliding bool, to string, toInc int64) {
		s := crdt.Slot{Key: key, Window: window, Replica: replica, Count: value}
		if it, err := DecodeSlot(s); err == nil {
			if !IsSlot(s) {
				t.Fatalf("DecodeSlot(%+q) accepted a slot IsSlot refuses", s)
			}
			if err := it.Validate(); err != nil {
				t.Fatalf("DecodeSlot(%+q) accepted an invalid item %v: %v", s, it, err)
			}
			if back := EncodeSlot(it); back != s {
				t.Fatalf("EncodeSlot(DecodeSlot(%+q)) = %+q", s, back)
			}
		} else if !errors.Is(err, ErrBadSlot) {
			t.Fatalf("DecodeSlot(%+q) = %v, not ErrBadSlot", s, err)
		}
		it := Item{Kind: Kind(kind), Key: key, Window: window, Spec: Spec{Limit: limit, Window: win, Sliding: sliding},
			Replica: replica, To: to, ToIncarnation: toInc, Value: value}
		if it.Validate() != nil {
			return
		}
		s = EncodeSlot(it)
		if !IsSlot(s) || s.Replica != it.Replica || !strings.HasSuffix(s.Key, it.Key) {
			t.Fatalf("EncodeSlot(%v) = %+q", it, s)
		}
		if got, err := DecodeSlot(s); err != nil || got != it {
			t.Fatalf("DecodeSlot(EncodeSlot(%v)) = %v, %v", it, got, err)
		}
	})
}

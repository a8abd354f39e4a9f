package escrow

import (
	"errors"
	"testing"

	"github.com/edgelimit/edgelimit/crdt"
)

var slotItems = []Item{
	{Kind: Count, Key: "api_key=abc", Window: 60 * sec, Spec: Spec{Limit: 100, Window: 60 * sec}, Replica: "fra1", Value: 42},
	{Kind: Requested, Key: "", Window: 0, Spec: Spec{Limit: 1, Window: 1, Sliding: true}, Replica: "a", Value: 0},
	{Kind: Give, Key: "\x00\x01\x02", Window: -sec, Spec: Spec{Limit: MaxLimit, Window: sec, Sliding: true},
		Replica: "ams-2", To: "fra_1", ToIncarnation: -5, Value: S},
}

func TestSlotRoundTrip(t *testing.T) {
	for _, it := range slotItems {
		s := EncodeSlot(it)
		if !IsSlot(s) || s.Key != it.Key || s.Window != it.Window || s.Count != it.Value {
			t.Fatalf("EncodeSlot(%v) = %v", it, s)
		}
		got, err := DecodeSlot(s)
		if err != nil || got != it {
			t.Fatalf("DecodeSlot(EncodeSlot(%v)) = %v, %v", it, got, err)
		}
	}
}

func TestDecodeSlotRejects(t *testing.T) {
	good := EncodeSlot(slotItems[2])
	for _, tc := range []struct {
		name    string
		replica string
	}{
		{"an ordinary count", "fra1"},
		{"empty", ""},
		{"mark only", "\x00"},
		{"unknown kind", "\x00\x07\x01a\x01\x01\x00"},
		{"kind zero", "\x00\x00\x01a\x01\x01\x00"},
		{"owner past the end", "\x00\x01\x09a\x01\x01\x00"},
		{"empty owner", "\x00\x01\x00\x01\x01\x00"},
		{"limit zero", "\x00\x01\x01a\x00\x01\x00"},
		{"window zero", "\x00\x01\x01a\x01\x00\x00"},
		{"flags missing", "\x00\x01\x01a\x01\x01"},
		{"unknown flag", "\x00\x01\x01a\x01\x01\x02"},
		{"trailing bytes", "\x00\x01\x01a\x01\x01\x00\x00"},
		{"non-minimal varint", "\x00\x01\x81\x00a\x01\x01\x00"},
		{"give without receiver", "\x00\x03\x01a\x01\x01\x00"},
		{"give to itself", "\x00\x03\x01a\x01\x01\x00\x01a\x00"},
		{"truncated give", good.Replica[:len(good.Replica)-1]},
		{"owner with a zero byte", "\x00\x01\x02a\x00\x01\x01\x00"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := crdt.Slot{Key: "k", Replica: tc.replica, Count: 1}
			if it, err := DecodeSlot(s); !errors.Is(err, ErrBadSlot) {
				t.Fatalf("DecodeSlot(%q) = %v, %v; want ErrBadSlot", tc.replica, it, err)
			}
		})
	}
	// A window not aligned to the spec's is refused too.
	s := EncodeSlot(slotItems[0])
	s.Window++
	if _, err := DecodeSlot(s); !errors.Is(err, ErrBadSlot) {
		t.Fatalf("unaligned window: %v", err)
	}
}

// FuzzDecodeSlot: decoding never panics; whatever it accepts encodes back to
// the same slot; and an item built from the inputs that validates survives
// the round trip unchanged.
func FuzzDecodeSlot(f *testing.F) {
	for _, it := range slotItems {
		s := EncodeSlot(it)
		f.Add(s.Key, s.Window, s.Replica, s.Count, uint8(it.Kind), it.Spec.Limit, it.Spec.Window, it.Spec.Sliding, it.To, it.ToIncarnation)
	}
	f.Add("k", int64(0), "fra1", uint64(1), uint8(1), int64(1), int64(1), false, "", int64(0))
	f.Fuzz(func(t *testing.T, key string, window int64, replica string, value uint64,
		kind uint8, limit, win int64, sliding bool, to string, toInc int64) {
		s := crdt.Slot{Key: key, Window: window, Replica: replica, Count: value}
		if it, err := DecodeSlot(s); err == nil {
			if err := it.Validate(); err != nil {
				t.Fatalf("DecodeSlot(%v) accepted an invalid item %v: %v", s, it, err)
			}
			if back := EncodeSlot(it); back != s {
				t.Fatalf("EncodeSlot(DecodeSlot(%v)) = %v", s, back)
			}
		} else if !errors.Is(err, ErrBadSlot) {
			t.Fatalf("DecodeSlot(%v) = %v, not ErrBadSlot", s, err)
		}
		it := Item{Kind: Kind(kind), Key: key, Window: window, Spec: Spec{Limit: limit, Window: win, Sliding: sliding},
			Replica: replica, To: to, ToIncarnation: toInc, Value: value}
		if it.Validate() != nil {
			return
		}
		s = EncodeSlot(it)
		if !IsSlot(s) {
			t.Fatalf("EncodeSlot(%v) = %v is no escrow slot", it, s)
		}
		if got, err := DecodeSlot(s); err != nil || got != it {
			t.Fatalf("DecodeSlot(EncodeSlot(%v)) = %v, %v", it, got, err)
		}
	})
}

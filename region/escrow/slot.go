package escrow

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/edgelimit/edgelimit/crdt"
)

// ErrBadSlot is wrapped by the errors DecodeSlot returns.
var ErrBadSlot = errors.New("escrow: bad slot")

// slotMark is the first byte of an escrow slot's Replica field. A replica
// name never holds it: replication admits PoP names of letters, digits, '-'
// and '_' only, and Item.Validate refuses a zero byte in a name. So whether
// a slot is an escrow slot is decided by its Replica field alone, whatever
// bytes its Key holds.
const slotMark = 0x00

// flagSliding is bit 0 of the spec flags byte.
const flagSliding = 1

// EncodeSlot maps a valid item (Item.Validate) onto a crdt.Slot, so that
// items travel, are stored and joined like counts: Key, Window and Count are
// the item's Key, Window and Value, and the Replica field holds the rest of
// the item's identity:
//
//	0x00  kind  uvarint(len owner) owner  uvarint(limit) uvarint(window) flags
//	      [Give only: uvarint(len to) to  varint(to incarnation)]
//
// where flags is 1 for a sliding window and 0 for a fixed one. The leading
// zero byte cannot begin a replica name, so the limit key stays untouched
// (any bytes, "" included) and no limit key can be mistaken for an escrow
// slot. Two items have equal slot identities (Key, Window, Replica) exactly
// when their identities and specs are equal, so crdt.Counters joins them with
// the same "largest value wins" rule as Ledger.Apply.
//
// The wiring must keep escrow slots out of the sums of ordinary counts:
// route every slot for which IsSlot holds to the Ledger.
func EncodeSlot(it Item) crdt.Slot {
	return crdt.Slot{Key: it.Key, Window: it.Window, Replica: string(appendHeader(nil, it)), Count: it.Value}
}

func appendHeader(b []byte, it Item) []byte {
	b = append(b, slotMark, byte(it.Kind))
	b = binary.AppendUvarint(b, uint64(len(it.Replica)))
	b = append(b, it.Replica...)
	b = binary.AppendUvarint(b, uint64(it.Spec.Limit))
	b = binary.AppendUvarint(b, uint64(it.Spec.Window))
	var flags byte
	if it.Spec.Sliding {
		flags |= flagSliding
	}
	b = append(b, flags)
	if it.Kind == Give {
		b = binary.AppendUvarint(b, uint64(len(it.To)))
		b = append(b, it.To...)
		b = binary.AppendVarint(b, it.ToIncarnation)
	}
	return b
}

// IsSlot reports whether s is an escrow slot (EncodeSlot's form) rather than
// an ordinary count: its Replica field begins with a zero byte.
func IsSlot(s crdt.Slot) bool { return len(s.Replica) > 0 && s.Replica[0] == slotMark }

// DecodeSlot reads back the item EncodeSlot wrote. It fails with ErrBadSlot,
// naming what is wrong, for anything else — an ordinary count, a truncated or
// overlong header, an unknown kind or flag, a non-minimal varint, an item
// that does not Validate — and never panics. For every slot it accepts,
// EncodeSlot(item) == s.
func DecodeSlot(s crdt.Slot) (Item, error) {
	it := Item{Key: s.Key, Window: s.Window, Value: s.Count}
	b := []byte(s.Replica)
	if len(b) < 2 || b[0] != slotMark {
		return Item{}, fmt.Errorf("%w: replica field %q is not an escrow header", ErrBadSlot, s.Replica)
	}
	it.Kind = Kind(b[1])
	b = b[2:]
	str := func(what string) (string, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return "", fmt.Errorf("%w: %s length", ErrBadSlot, what)
		}
		v := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return v, nil
	}
	uvarint := func(what string) (uint64, error) {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, fmt.Errorf("%w: %s is not a uvarint", ErrBadSlot, what)
		}
		b = b[k:]
		return v, nil
	}
	var err error
	if it.Replica, err = str("owner"); err != nil {
		return Item{}, err
	}
	limit, err := uvarint("limit")
	if err != nil {
		return Item{}, err
	}
	window, err := uvarint("window")
	if err != nil {
		return Item{}, err
	}
	if limit > MaxLimit || window > 1<<63-1 {
		return Item{}, fmt.Errorf("%w: spec limit %d window %d out of range", ErrBadSlot, limit, window)
	}
	it.Spec.Limit, it.Spec.Window = int64(limit), int64(window)
	if len(b) == 0 || b[0]&^flagSliding != 0 {
		return Item{}, fmt.Errorf("%w: spec flags missing or unknown", ErrBadSlot)
	}
	it.Spec.Sliding = b[0]&flagSliding != 0
	b = b[1:]
	if it.Kind == Give {
		if it.To, err = str("to"); err != nil {
			return Item{}, err
		}
		v, k := binary.Varint(b)
		if k <= 0 {
			return Item{}, fmt.Errorf("%w: to incarnation is not a varint", ErrBadSlot)
		}
		it.ToIncarnation = v
		b = b[k:]
	}
	if len(b) != 0 {
		return Item{}, fmt.Errorf("%w: %d trailing bytes", ErrBadSlot, len(b))
	}
	if err := it.Validate(); err != nil {
		return Item{}, fmt.Errorf("%w: %w", ErrBadSlot, err)
	}
	// One encoding per item: a varint written with more bytes than it needs
	// would give one item two slot identities.
	if !bytes.Equal(appendHeader(nil, it), []byte(s.Replica)) {
		return Item{}, fmt.Errorf("%w: header is not in canonical form", ErrBadSlot)
	}
	return it, nil
}

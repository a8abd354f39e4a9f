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

// The two bytes every escrow slot's Key begins with. No ordinary limit key
// begins with slotMark: every store key is built by rules.Limit.AppendKey
// (pop/rules/rules.go), which starts it with appendPart(domain) — the
// uvarint of the domain name's length, then the name — and the rule loader
// (the parser's domain method in pop/rules/load.go) refuses an empty domain
// ("domain must not be empty"). The uvarint of a length of 1 or more never
// begins with a zero byte, so a limit key's first byte is never 0x00.
// slotMark2 (0xE5, "escrow") makes the mark two bytes long, so that a key
// some other producer starts with a zero byte is still not taken for an
// escrow slot unless it also carries the second byte.
const (
	slotMark  = 0x00
	slotMark2 = 0xE5
)

// flagSliding is bit 0 of the spec flags byte.
const flagSliding = 1

// EncodeSlot maps a valid item (Item.Validate) onto a crdt.Slot, so that
// items travel, are stored and joined like counts. Window and Count are the
// item's Window and Value, Replica is its owner (a plain replica name, as
// the transport requires: a message carries one replica name, the sender's,
// for all its slots, and receivers drop a slot whose replica is not the
// sender), and Key is a header followed by the item's limit key:
//
//	Key = 0x00 0xE5 kind uvarint(limit) uvarint(window ns) flags
//	      [Give only: uvarint(len to) to  varint(to incarnation)]
//	      limit key (the remaining bytes, any, "" included)
//
// where kind is the Kind byte (1 count, 2 requested, 3 give) and flags is 1
// for a sliding window and 0 for a fixed one. Every header field delimits
// itself, so the header ends at a known byte and the rest of Key is the
// limit key whatever bytes it holds. No ordinary limit key begins with 0x00
// (see slotMark), so none is mistaken for an escrow slot. Two items have
// equal slot identities (Key, Window, Replica) exactly when their identities
// and specs are equal, so crdt.Counters joins them with the same "largest
// value wins" rule as Ledger.Apply.
//
// The wiring must keep escrow slots out of the sums of ordinary counts and
// out of the limit-key lookups (rules.ParseKey, the receiver's count
// bounds): route every slot for which IsSlot holds to the Ledger first.
func EncodeSlot(it Item) crdt.Slot {
	b := appendHeader(make([]byte, 0, headerSize(it)+len(it.Key)), it)
	b = append(b, it.Key...)
	return crdt.Slot{Key: string(b), Window: it.Window, Replica: it.Replica, Count: it.Value}
}

// headerSize is the most bytes appendHeader writes for it.
func headerSize(it Item) int {
	n := 2 + 1 + 2*binary.MaxVarintLen64 + 1
	if it.Kind == Give {
		n += 2*binary.MaxVarintLen64 + len(it.To)
	}
	return n
}

func appendHeader(b []byte, it Item) []byte {
	b = append(b, slotMark, slotMark2, byte(it.Kind))
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
// an ordinary count: its Key begins with the two bytes 0x00 0xE5. It does
// not check the rest; DecodeSlot does.
func IsSlot(s crdt.Slot) bool {
	return len(s.Key) >= 2 && s.Key[0] == slotMark && s.Key[1] == slotMark2
}

// DecodeSlot reads back the item EncodeSlot wrote: the header from the front
// of the Key, the limit key from the rest of it, the owner from Replica. It
// fails with ErrBadSlot, naming what is wrong, for anything else — an
// ordinary count, a truncated header, an unknown kind or flag, a
// non-minimal varint, an item that does not Validate (an owner that is
// empty, longer than MaxName or holds a zero byte, among others) — and never
// panics. For every slot it accepts, EncodeSlot(item) == s.
func DecodeSlot(s crdt.Slot) (Item, error) {
	if !IsSlot(s) {
		return Item{}, fmt.Errorf("%w: key %q does not begin with the escrow mark", ErrBadSlot, prefix(s.Key))
	}
	it := Item{Window: s.Window, Replica: s.Replica, Value: s.Count}
	b := s.Key[2:]
	if len(b) == 0 {
		return Item{}, fmt.Errorf("%w: kind missing", ErrBadSlot)
	}
	it.Kind = Kind(b[0])
	if it.Kind < Count || it.Kind > Give {
		return Item{}, fmt.Errorf("%w: unknown kind %d", ErrBadSlot, b[0])
	}
	b = b[1:]
	uvarint := func(what string) (uint64, error) {
		v, k := binary.Uvarint([]byte(b[:min(len(b), binary.MaxVarintLen64)]))
		if k <= 0 {
			return 0, fmt.Errorf("%w: %s is not a uvarint", ErrBadSlot, what)
		}
		b = b[k:]
		return v, nil
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
	if len(b) == 0 {
		return Item{}, fmt.Errorf("%w: spec flags missing", ErrBadSlot)
	}
	if b[0]&^flagSliding != 0 {
		return Item{}, fmt.Errorf("%w: unknown spec flags %#x", ErrBadSlot, b[0])
	}
	it.Spec.Sliding = b[0]&flagSliding != 0
	b = b[1:]
	if it.Kind == Give {
		n, err := uvarint("to length")
		if err != nil {
			return Item{}, err
		}
		if n > uint64(len(b)) {
			return Item{}, fmt.Errorf("%w: to of %d bytes past the end of the key", ErrBadSlot, n)
		}
		it.To, b = b[:n], b[n:]
		v, k := binary.Varint([]byte(b[:min(len(b), binary.MaxVarintLen64)]))
		if k <= 0 {
			return Item{}, fmt.Errorf("%w: to incarnation is not a varint", ErrBadSlot)
		}
		it.ToIncarnation = v
		b = b[k:]
	}
	header := s.Key[:len(s.Key)-len(b)]
	it.Key = b
	if err := it.Validate(); err != nil {
		return Item{}, fmt.Errorf("%w: %w", ErrBadSlot, err)
	}
	// One encoding per item: a varint written with more bytes than it needs
	// would give one item two slot identities.
	if !bytes.Equal(appendHeader(make([]byte, 0, len(header)), it), []byte(header)) {
		return Item{}, fmt.Errorf("%w: header is not in canonical form", ErrBadSlot)
	}
	return it, nil
}

// prefix returns the first bytes of key, enough to show in an error.
func prefix(key string) string { return key[:min(len(key), 16)] }

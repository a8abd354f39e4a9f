package escrow

import (
	"errors"
	"fmt"
	"strings"
)

// Kind says what an Item counts.
type Kind uint8

const (
	// Count is the owner's admitted hits in the window: C.
	Count Kind = iota + 1
	// Requested is the owner's requested hits in the window, admitted and
	// denied: R, the demand that rebalancing follows.
	Requested
	// Give is the allowance the owner gave To for the window, in units of
	// 1/Scale of the limit: give(owner→To).
	Give
)

// String names the kind for logs and test failures.
func (k Kind) String() string {
	switch k {
	case Count:
		return "count"
	case Requested:
		return "requested"
	case Give:
		return "give"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MaxName is the longest replica name an Item carries, in bytes.
const MaxName = 255

// ErrBadItem is wrapped by the errors Item.Validate and Ledger.Apply return
// for an item no replica of the scope could have published.
var ErrBadItem = errors.New("escrow: bad item")

// Item is one absolute counter a replica owns for one (key, window) — its
// count, its requested hits, or what it gave one other replica — as it is
// published, saved and restored. Every counter only grows, so receivers join
// items by keeping the largest Value per identity, and duplicated, reordered
// or replayed items are harmless.
//
// An item's identity is (Kind, Key, Window, Replica, To, ToIncarnation).
// Spec travels with every item so that a replica that never saw a request for
// the key still knows its window and limit, and can give.
type Item struct {
	Kind    Kind
	Key     string // limit key, opaque bytes; "" is a valid key
	Window  int64  // window start, unix ns, a multiple of Spec.Window
	Spec    Spec   // how the key counts
	Replica string // the owner: the replica that counted or gave

	// To and ToIncarnation name the receiver of a Give: the replica, and
	// its incarnation as the giver knew it (see Ledger). Empty and 0 for
	// the other kinds.
	To            string
	ToIncarnation int64

	Value uint64 // the absolute counter; only grows
}

// String formats it for logs and test failures.
func (it Item) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s key=%q window=%d replica=%q", it.Kind, it.Key, it.Window, it.Replica)
	if it.Kind == Give {
		fmt.Fprintf(&b, " to=%q@%d", it.To, it.ToIncarnation)
	}
	fmt.Fprintf(&b, " value=%d", it.Value)
	return b.String()
}

// Validate reports whether it is well formed: a known kind, a valid spec, a
// window start aligned to the spec's window, valid replica names (1 to
// MaxName bytes, no zero byte), and for a Give a receiver other than the
// owner; To and ToIncarnation are zero for the other kinds.
func (it Item) Validate() error {
	if it.Kind < Count || it.Kind > Give {
		return fmt.Errorf("%w: kind %d", ErrBadItem, uint8(it.Kind))
	}
	if err := it.Spec.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadItem, err)
	}
	if windowStart(it.Window, it.Spec.Window) != it.Window {
		return fmt.Errorf("%w: window %d not aligned to %dns", ErrBadItem, it.Window, it.Spec.Window)
	}
	if err := validName(it.Replica); err != nil {
		return fmt.Errorf("%w: replica: %w", ErrBadItem, err)
	}
	if it.Kind == Give {
		if err := validName(it.To); err != nil {
			return fmt.Errorf("%w: to: %w", ErrBadItem, err)
		}
		if it.To == it.Replica {
			return fmt.Errorf("%w: %q gives to itself", ErrBadItem, it.To)
		}
	} else if it.To != "" || it.ToIncarnation != 0 {
		return fmt.Errorf("%w: %s with a receiver", ErrBadItem, it.Kind)
	}
	return nil
}

// validName reports whether s can name a replica: 1 to MaxName bytes and no
// zero byte. Replication admits PoP names of letters, digits, '-' and '_'
// only; a name travels as a slot's Replica field (see EncodeSlot).
func validName(s string) error {
	switch {
	case s == "":
		return errors.New("empty name")
	case len(s) > MaxName:
		return fmt.Errorf("name of %d bytes, more than %d", len(s), MaxName)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("name %q holds a zero byte", s)
	}
	return nil
}

package crdt

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
)

// Bit is a mitigation bit: "Key is over a limit of this Scope until Until".
// While a bit holds (now < Until) a PoP denies Key at once, without counting.
type Bit struct {
	Key    string // limit key, as in Slot
	Scope  uint8  // which limit tripped (region, global, ...); opaque to this package
	Until  int64  // unix nanoseconds; the bit holds while now < Until
	Origin string // the replica or region that raised the bit
}

// String formats b for logs and test failures.
func (b Bit) String() string {
	return fmt.Sprintf("key=%q scope=%d until=%d origin=%q", b.Key, b.Scope, b.Until, b.Origin)
}

// CompareBits orders bits by Key, then Scope, then Until, then Origin: the
// order of Bits.Active and Bits.All.
func CompareBits(a, b Bit) int {
	if c := cmp.Compare(a.Key, b.Key); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Scope, b.Scope); c != 0 {
		return c
	}
	if c := cmp.Compare(a.Until, b.Until); c != 0 {
		return c
	}
	return cmp.Compare(a.Origin, b.Origin)
}

// Bits holds mitigation bits as one max-register per (key, scope): the bit
// with the latest Until wins, and of two bits with the same Until the one with
// the greater Origin wins, so every replica that joined the same bits holds
// the same one whatever the order. Join is commutative, associative and
// idempotent.
//
// Bits reads no clock: Active and Expire take the instant. A bit that has
// expired but was not yet removed by Expire is still held (Get and All return
// it) but is not Active.
//
// The zero value is an empty Bits ready to use. A Bits is not safe for
// concurrent use.
type Bits struct {
	m map[bitKey]Bit
}

type bitKey struct {
	key   string
	scope uint8
}

// Join merges bits into s, keeping per (key, scope) the winning bit, and
// returns how many registers changed.
func (s *Bits) Join(bits ...Bit) (changed int) {
	for _, b := range bits {
		k := bitKey{b.Key, b.Scope}
		cur, ok := s.m[k]
		if ok && !wins(b, cur) {
			continue
		}
		if s.m == nil {
			s.m = make(map[bitKey]Bit)
		}
		s.m[k] = b
		changed++
	}
	return changed
}

// wins reports whether a replaces b in the register of their (key, scope).
func wins(a, b Bit) bool {
	return a.Until > b.Until || (a.Until == b.Until && a.Origin > b.Origin)
}

// Get returns the bit held for (key, scope), whether or not it has expired.
// Callers compare Until with the current time, or use Active.
func (s *Bits) Get(key string, scope uint8) (Bit, bool) {
	b, ok := s.m[bitKey{key, scope}]
	return b, ok
}

// Active returns the bits that hold at now (now < Until), in CompareBits
// order, or nil if none. The slice is new; the caller owns it.
func (s *Bits) Active(now int64) []Bit {
	var out []Bit
	for _, b := range s.m {
		if now < b.Until {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, CompareBits)
	return out
}

// All returns every bit held, expired or not, in CompareBits order: the state
// for a snapshot or an anti-entropy exchange. The slice is new; the caller
// owns it.
func (s *Bits) All() []Bit {
	if len(s.m) == 0 {
		return nil
	}
	out := slices.AppendSeq(make([]Bit, 0, len(s.m)), maps.Values(s.m))
	slices.SortFunc(out, CompareBits)
	return out
}

// Expire removes the bits that no longer hold at now (Until <= now) and
// returns how many it removed. An expired bit joined again later is held
// again until the next Expire, but is never Active.
func (s *Bits) Expire(now int64) (expired int) {
	for k, b := range s.m {
		if b.Until <= now {
			delete(s.m, k)
			expired++
		}
	}
	return expired
}

// Len returns the number of bits held, expired or not.
func (s *Bits) Len() int { return len(s.m) }

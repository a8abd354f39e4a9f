package escrow

import (
	"fmt"

	"github.com/edgelimit/edgelimit/crdt"
)

// newsKey and partialKey are the Keys of the slots that carry a replica's
// News, with a watermark and Partial. Like an escrow slot's, they begin with
// a zero byte, which no limit key does (see IsSlot), and differ from every
// escrow slot's header.
const (
	newsKey    = "\x00escrow-news"
	partialKey = "\x00escrow-alive"
)

// EncodeNews maps n onto a crdt.Slot, so that it travels beside the items:
// Key newsKey, Replica the sender, Count its incarnation, and Window its
// watermark. Partial news has no watermark and travels with Window 0 under
// partialKey, one slot per sender whatever the time: the receiver takes the
// send time of the message that carried it as SentAt. A slot per distinct watermark, joined by the
// largest incarnation: duplicates and replays are harmless, as for items.
// Partial news travels under a key of its own, so that no join mixes it
// with a watermark.
// An incarnation before the epoch travels as 0, which claims nothing.
func EncodeNews(n News) crdt.Slot {
	key := newsKey
	if n.Partial {
		key = partialKey
	}
	sent := max(n.SentAt, 0)
	if n.Partial {
		sent = 0 // one slot per sender: the message's own send time says when
	}
	return crdt.Slot{Key: key, Window: sent, Replica: n.From, Count: uint64(max(n.Incarnation, 0))}
}

// IsNews reports whether s is a slot EncodeNews wrote.
func IsNews(s crdt.Slot) bool { return s.Key == newsKey || s.Key == partialKey }

// DecodeNews reads back the News EncodeNews wrote. It fails with ErrBadSlot
// for another slot, a sender that cannot name a replica, a negative
// watermark or an incarnation past the largest instant; it never panics.
func DecodeNews(s crdt.Slot) (News, error) {
	switch {
	case !IsNews(s):
		return News{}, fmt.Errorf("%w: key %q is not a news slot", ErrBadSlot, s.Key)
	case s.Window < 0:
		return News{}, fmt.Errorf("%w: news watermark %d before the epoch", ErrBadSlot, s.Window)
	case s.Count > 1<<63-1:
		return News{}, fmt.Errorf("%w: news incarnation %d out of range", ErrBadSlot, s.Count)
	}
	if err := validName(s.Replica); err != nil {
		return News{}, fmt.Errorf("%w: news sender: %w", ErrBadSlot, err)
	}
	return News{From: s.Replica, Incarnation: int64(s.Count), SentAt: s.Window, Partial: s.Key == partialKey}, nil
}

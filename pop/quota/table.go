package quota

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
)

// table is an immutable-once-built, open-addressed hash table from API key to
// quota, probed linearly. It exists so that the check path's lookup hashes
// the key once (the caller passes the hash, shared by every table of one
// Index) and costs as few cache misses as it can, and so that the garbage
// collector has nothing in it to mark.
//
// Neither array holds a pointer, so both are allocated noscan: with a
// million keys, a table of slots holding string headers and *Quota made the
// collector visit millions of pointers on every cycle, which on a PoP
// serving checks was half of what 100k quotas cost it (see docs/tenants.md). A slot holds the full 64-bit hash, compared first, the offset of
// the key's record in recs, the index of its Plan (Index.plans), the key's
// length and, when it is at most 15 bytes, the key itself; the record holds
// the key's times, then its key bytes. So a lookup of a key not in the
// CPU's caches misses once (the slot) for a short key without effective_at
// or expires_at, else twice (slot, record) — not three times (slot, key
// bytes, quota) as when slots pointed at both. A slot with rec 0 is empty; nothing is ever
// removed (a deletion is a new table, or a tombstone in a delta). Its size
// is not a power of two — a hash picks its slot by multiplication (Lemire's
// fast range) — so that it takes about 4/3 of a slot per key, not up to 8/3.
//
// The zero table is empty. Lookups are safe for concurrent use once the
// table is published; put, add and set must not race anything.
type table struct {
	slots []slot
	recs  []byte // records (see rec*), from offset recStart
	n     int
}

type slot struct {
	hash   uint64
	rec    uint32   // offset of the key's record in recs; 0: empty
	plan   uint32   // the key's plan in Index.plans; tombstonePlan: deleted
	head   uint8    // the key's length, plus slotTimed
	inline [15]byte // the key, when it is that short (32 bytes a slot)
}

// slotTimed marks in a slot's head a key whose record has an effective_at or
// expires_at: one without needs no look at its record to be found in force.
const slotTimed = 0x80

// newSlot returns the slot of key (hash h) with its record at rec, timed
// when it has an effective_at or expires_at (q nil: none).
func newSlot[K string | []byte](h uint64, key K, rec, plan uint32, q *Quota) slot {
	s := slot{hash: h, rec: rec, plan: plan, head: uint8(len(key))}
	if q != nil && (q.EffectiveAt != 0 || q.ExpiresAt != 0) {
		s.head |= slotTimed
	}
	if len(key) <= len(s.inline) {
		copy(s.inline[:], key)
	}
	return s
}

// is reports whether s, of t, holds key: from the slot alone for a short
// key, else from its record.
func is[K string | []byte](t *table, s *slot, key K) bool {
	n := int(s.head &^ slotTimed)
	if n != len(key) {
		return false
	}
	if n <= len(s.inline) {
		return string(s.inline[:n]) == string(key)
	}
	return string(t.key(s.rec)) == string(key)
}

// inForce reports whether the key of s, of t, has its quota in force at
// now.
func (t *table) inForce(s *slot, now int64) bool {
	if s.head&slotTimed == 0 {
		return true
	}
	eff, exp := t.times(s.rec)
	return inForce(now, eff, exp)
}

// A record is the key's EffectiveAt, ExpiresAt and UpdatedAt (8 bytes each,
// little-endian), its length (1 byte: MaxKeyBytes is 64) and its bytes.
// Offsets are 32 bits: recs holds at most 4 GiB, some 45 million keys.
const (
	recEffective = 0
	recExpires   = 8
	recUpdated   = 16
	recKeyLen    = 24
	recKey       = 25
	recStart     = 8 // offset 0 means an empty slot
)

// tombstonePlan is the plan of a key deleted, in an Index's delta.
const tombstonePlan = ^uint32(0)

// newTable returns an empty table sized for n keys (at most three quarters
// full, so that a probe sequence stays short) and keyBytes bytes of keys.
func newTable(n, keyBytes int) table {
	return table{slots: make([]slot, max(8, n+n/3+1)), recs: make([]byte, recStart, recStart+n*recKey+keyBytes)}
}

// home is the first slot probed for hash h.
func (t *table) home(h uint64) int {
	hi, _ := bits.Mul64(h, uint64(len(t.slots)))
	return int(hi)
}

// key is the key of the record at off.
func (t *table) key(off uint32) []byte {
	r := t.recs[off:]
	return r[recKey : recKey+int(r[recKeyLen])]
}

// times are the EffectiveAt and ExpiresAt of the record at off.
func (t *table) times(off uint32) (effectiveAt, expiresAt Time) {
	r := t.recs[off:]
	return Time(binary.LittleEndian.Uint64(r[recEffective:])), Time(binary.LittleEndian.Uint64(r[recExpires:]))
}

func (t *table) updated(off uint32) Time {
	return Time(binary.LittleEndian.Uint64(t.recs[off+recUpdated:]))
}

// find returns the slot of key, whose hash is h, or nil.
func (t *table) find(h uint64, key string) *slot { return findIn(t, h, key) }

// findBytes is find of a key held as bytes.
func (t *table) findBytes(h uint64, key []byte) *slot { return findIn(t, h, key) }

// findIn is find for a key held as a string or as bytes: comparing
// string(b) with string(key) does not allocate.
func findIn[K string | []byte](t *table, h uint64, key K) *slot {
	if t.n == 0 {
		return nil
	}
	for i := t.home(h); ; {
		s := &t.slots[i]
		if s.rec == 0 {
			return nil
		}
		if s.hash == h && is(t, s, key) {
			return s
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// appendRec appends a record of key with q's times (zero when q is nil) to
// recs and returns its offset.
func appendRec[K string | []byte](t *table, key K, q *Quota) uint32 {
	off := len(t.recs)
	if off+recKey+len(key) > 1<<32-1 {
		panic("quota: more than 4 GiB of quota records")
	}
	var eff, exp, upd Time
	if q != nil {
		eff, exp, upd = q.EffectiveAt, q.ExpiresAt, q.UpdatedAt
	}
	t.recs = binary.LittleEndian.AppendUint64(t.recs, uint64(eff))
	t.recs = binary.LittleEndian.AppendUint64(t.recs, uint64(exp))
	t.recs = binary.LittleEndian.AppendUint64(t.recs, uint64(upd))
	t.recs = append(t.recs, byte(len(key)))
	t.recs = append(t.recs, key...)
	return uint32(off)
}

// setTimes writes q's times over the record of s (same key, same size).
func (t *table) setTimes(s *slot, q *Quota) {
	s.head &^= slotTimed
	if q.EffectiveAt != 0 || q.ExpiresAt != 0 {
		s.head |= slotTimed
	}
	r := t.recs[s.rec:]
	binary.LittleEndian.PutUint64(r[recEffective:], uint64(q.EffectiveAt))
	binary.LittleEndian.PutUint64(r[recExpires:], uint64(q.ExpiresAt))
	binary.LittleEndian.PutUint64(r[recUpdated:], uint64(q.UpdatedAt))
}

// grow makes t big enough for one more key when it would be more than three
// quarters full.
func (t *table) grow() {
	if (t.n+1)*4 <= len(t.slots)*3 {
		return
	}
	bigger := table{slots: make([]slot, max(8, 2*(t.n+1)+2*(t.n+1)/3+1)), recs: t.recs}
	for i := range t.slots {
		if s := &t.slots[i]; s.rec != 0 {
			bigger.insert(*s)
		}
	}
	t.slots = bigger.slots
}

// set makes key (hash h) hold plan with q's times (q nil: zero times),
// replacing what it held.
func set[K string | []byte](t *table, h uint64, key K, q *Quota, plan uint32) {
	if s := findIn(t, h, key); s != nil {
		*s = newSlot(h, key, appendRec(t, key, q), plan, q)
		return
	}
	t.grow()
	t.insert(newSlot(h, key, appendRec(t, key, q), plan, q))
}

// insert puts s, of a key not in t, in its first free slot. It requires
// room (grow, or a table made by newTable for at least t.n+1 keys).
func (t *table) insert(s slot) {
	for i := t.home(s.hash); ; {
		if t.slots[i].rec == 0 {
			t.slots[i] = s
			t.n++
			return
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// copyFrom puts the key of slot s of table from, with its record, in t
// with plan: a key not in t (a fold), or one it replaces.
func (t *table) copyFrom(from *table, s *slot, plan uint32) {
	key := from.key(s.rec)
	r := from.recs[s.rec : int(s.rec)+recKey+len(key)]
	c := *s
	c.rec, c.plan = uint32(len(t.recs)), plan
	t.recs = append(t.recs, r...)
	if d := t.findBytes(s.hash, key); d != nil {
		*d = c
		return
	}
	t.grow()
	t.insert(c)
}

// each calls fn with every slot held, in slot order.
func (t *table) each(fn func(s *slot)) {
	for i := range t.slots {
		if s := &t.slots[i]; s.rec != 0 {
			fn(s)
		}
	}
}

// hashKey is the hash of key under seed; one Index uses one seed for all its
// tables. maphash.Bytes of the same bytes gives the same hash.
func hashKey(seed maphash.Seed, key string) uint64 { return maphash.String(seed, key) }

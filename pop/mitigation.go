package pop

import (
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/edgelimit/edgelimit/crdt"
	"github.com/edgelimit/edgelimit/pop/limit"
)

const mitShards = 64

// DefaultMinMitigation is the shortest bit worth issuing. A bit must reach
// the other PoPs before it ends to be of use, and it takes replication's
// BitsInterval (10 ms) plus the network, often more than 100 ms across
// regions, to get there: a key that is over a per-second limit only
// until its next slot frees (often a millisecond under steady overload) is
// left to the counts, which replicate anyway.
const DefaultMinMitigation = time.Second

// Mitigations is a PoP's table of mitigation bits: limit keys known to be over
// a region or global limit, which the engine denies at once, without asking
// the counter store, until the bit's end time. A bit is issued when a check of
// a region or global limit finds the key over it, and travels to the other
// PoPs in scope (replication.Bits: BitsDelta and ApplyBits); per (key, scope)
// the latest end time wins, so bits join like a max-register (crdt.Bits).
//
// The zero value is not usable; use NewMitigations. Safe for concurrent use:
// lookups take a shard's read lock.
type Mitigations struct {
	// MinDuration is the shortest bit Issue records; set it before use.
	// NewMitigations sets DefaultMinMitigation.
	MinDuration time.Duration

	self    string
	seed    maphash.Seed
	shards  [mitShards]mitShard
	pmu     sync.Mutex
	pending []crdt.Bit    // issued or extended here since the last BitsDelta
	issuedC chan struct{} // a token after pending grew (BitsIssued)

	issued, applied atomic.Uint64
}

type mitShard struct {
	mu sync.RWMutex
	m  map[string]mitBit // by limit key; a key has one scope (it is in the key)
	_  [64 - 32]byte
}

type mitBit struct {
	until  int64
	scope  limit.Scope
	origin string
}

// NewMitigations returns an empty table for the PoP named self.
func NewMitigations(self string) *Mitigations {
	m := &Mitigations{MinDuration: DefaultMinMitigation, self: self, seed: maphash.MakeSeed(), issuedC: make(chan struct{}, 1)}
	for i := range m.shards {
		m.shards[i].m = make(map[string]mitBit)
	}
	return m
}

func (m *Mitigations) shard(key []byte) *mitShard {
	return &m.shards[maphash.Bytes(m.seed, key)%mitShards]
}

// Until reports whether key is mitigated at now, and until when. It does not
// allocate.
func (m *Mitigations) Until(key []byte, now int64) (int64, bool) {
	sh := m.shard(key)
	sh.mu.RLock()
	b, ok := sh.m[string(key)]
	sh.mu.RUnlock()
	if !ok || b.until <= now {
		return 0, false
	}
	return b.until, true
}

// Issue records at now that key is over its limit of scope until the given
// time, as decided here; it reports whether that changed what the table knew
// (and so must be published). A key that stays over its limit is found over
// again and again, each time until a little later; re-issuing for every such
// nudge would flood the other PoPs, so a known bit is only extended when the
// new end is later by more than an eighth of the time it has left to run.
//
// A bit shorter than MinDuration is not issued.
func (m *Mitigations) Issue(key []byte, scope limit.Scope, until, now int64) bool {
	if until-now < int64(m.MinDuration) {
		return false
	}
	if old, ok := m.Until(key, now); ok && until-old <= (until-now)/8 {
		return false
	}
	if !m.join(string(key), mitBit{until: until, scope: scope, origin: m.self}) {
		return false
	}
	m.issued.Add(1)
	m.pmu.Lock()
	m.pending = append(m.pending, crdt.Bit{Key: string(key), Scope: uint8(scope), Until: until, Origin: m.self})
	m.pmu.Unlock()
	select { // one token is enough: the reader takes every pending bit
	case m.issuedC <- struct{}{}:
	default:
	}
	return true
}

// BitsIssued returns a channel that receives after Issue recorded a bit for
// BitsDelta to return, so that replication can publish it at once instead of
// at the next flush (replication.BitsNotifier). Issues while a token waits
// add none.
func (m *Mitigations) BitsIssued() <-chan struct{} { return m.issuedC }

// join keeps the later bit; requires nothing held.
func (m *Mitigations) join(key string, b mitBit) bool {
	sh := m.shard([]byte(key))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if old, ok := sh.m[key]; ok && (old.until > b.until || (old.until == b.until && old.origin >= b.origin)) {
		return false
	}
	sh.m[key] = b
	return true
}

// BitsDelta returns the bits issued or extended here since the last call.
func (m *Mitigations) BitsDelta() []crdt.Bit {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	out := m.pending
	m.pending = nil
	return out
}

// ApplyBits joins other PoPs' bits: per key the latest end time wins.
func (m *Mitigations) ApplyBits(bits []crdt.Bit) {
	for _, b := range bits {
		if b.Origin == m.self {
			continue
		}
		if m.join(b.Key, mitBit{until: b.Until, scope: limit.Scope(b.Scope), origin: b.Origin}) {
			m.applied.Add(1)
		}
	}
}

// Active returns the bits in force at now, ordered by key.
func (m *Mitigations) Active(now int64) []crdt.Bit {
	var out []crdt.Bit
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.RLock()
		for k, b := range sh.m {
			if b.until > now {
				out = append(out, crdt.Bit{Key: k, Scope: uint8(b.scope), Until: b.until, Origin: b.origin})
			}
		}
		sh.mu.RUnlock()
	}
	slices.SortFunc(out, crdt.CompareBits)
	return out
}

// Sweep drops the bits that ended at or before now and returns how many.
func (m *Mitigations) Sweep(now int64) int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		for k, b := range sh.m {
			if b.until <= now {
				delete(sh.m, k)
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

// MitigationStats counts bits.
type MitigationStats struct {
	// Issued counts bits this PoP issued or extended; Applied, other PoPs'
	// bits that changed this table.
	Issued, Applied uint64
}

// Stats reports the counts so far.
func (m *Mitigations) Stats() MitigationStats {
	return MitigationStats{Issued: m.issued.Load(), Applied: m.applied.Load()}
}

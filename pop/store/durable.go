package store

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/edgelimit/edgelimit/pop/limit"
)

// What makes a Memory store's own table durable (MemoryConfig.Durable): the
// keys not counted across PoPs — every limit of scope pop, every limit of a
// PoP without a replica name, and the algorithms that do not replicate
// (token_bucket, gcra, sliding_log) at any scope. Replicated windows are
// persisted by replication as CRDT slots (Delta, Restore); these are saved
// as opaque records of the key's whole limit.State.
//
// A check that admitted hits notes the key's hash in its shard's change log;
// a sweep or an eviction that removes a key notes its name. TakeStates hands
// both out — the latest state of every key changed since the last call, and
// the keys gone — and a driver writes them to disk every flush interval. A
// crash loses the admissions since the last write that succeeded; a restart
// RestoreStates them before the first check.

// changeLog is one shard's changes since the last TakeStates. It is guarded
// by the shard's mutex; it lives beside the shards, not in them, so that a
// shard stays two cache lines.
type changeLog struct {
	hashes []uint64 // keys that admitted hits; repeats allowed
	gone   []string // keys removed from the table
	all    bool     // hashes overflowed: every key of the shard counts as changed
	_      [15]byte // one cache line per shard's log
}

// maxChangeLog bounds a shard's change log: past it, the shard is saved
// whole at the next TakeStates, and a hot key admitting a million hits
// between two flushes costs no memory for it.
func (s *Memory) maxChangeLog() int { return max(s.perShard, 256) }

// noteChanged records that the key hashed h, in shard i, admitted hits.
// Requires the shard's mutex held, and s.durable.
func (s *Memory) noteChanged(i int, h uint64) {
	c := &s.changes[i]
	if c.all {
		return
	}
	if len(c.hashes) >= s.maxChangeLog() {
		c.all, c.hashes = true, c.hashes[:0]
		return
	}
	c.hashes = append(c.hashes, h)
}

// noteGone records that key left shard i. Requires the shard's mutex held.
func (s *Memory) noteGone(i int, key string) {
	if s.durable {
		s.changes[i].gone = append(s.changes[i].gone, key)
	}
}

// StateRecord is one key's saved state: Value is its expiry (the time at
// which it decides as a fresh state would, limit.Spec.IdleAt) then its
// limit.State, as AppendState writes it. Key and Value are the caller's.
type StateRecord struct {
	Key   string
	Value []byte
}

// TakeStates returns, and forgets, what changed since the last call: the
// records of keys that admitted hits (their latest state) and the keys the
// store removed. A key removed and then counting again shows up in both;
// apply the deletions first. Call it from one goroutine; when the records
// could not be saved, call ResaveAll so that the next call returns every key.
// It returns nothing unless MemoryConfig.Durable is set.
func (s *Memory) TakeStates() (changed []StateRecord, gone []string) {
	if !s.durable {
		return nil, nil
	}
	var hashes []uint64
	for i := range s.shards {
		sh, c := &s.shards[i], &s.changes[i]
		sh.mu.Lock()
		gone = append(gone, c.gone...)
		clear(c.gone)
		c.gone = c.gone[:0]
		if c.all {
			for j := range sh.t.slots {
				if sl := &sh.t.slots[j]; sl.hash != 0 && sl.idleAt != inUse {
					changed = append(changed, record(sh.t.keys[j], sl))
				}
			}
		} else if len(c.hashes) > 0 {
			hashes = append(hashes[:0], c.hashes...)
			slices.Sort(hashes)
			for _, h := range slices.Compact(hashes) {
				if j := sh.t.find(h); j >= 0 {
					changed = append(changed, record(sh.t.keys[j], &sh.t.slots[j]))
				}
			}
		}
		c.hashes, c.all = c.hashes[:0], false
		sh.mu.Unlock()
	}
	return changed, gone
}

// ResaveAll makes the next TakeStates return every key the store holds: a
// driver calls it when it could not save what TakeStates returned.
func (s *Memory) ResaveAll() {
	if !s.durable {
		return
	}
	for i := range s.shards {
		s.shards[i].mu.Lock()
		s.changes[i].all, s.changes[i].hashes = true, s.changes[i].hashes[:0]
		s.shards[i].mu.Unlock()
	}
}

// record encodes a slot's state. Requires the slot's shard locked.
func record(key string, sl *slot) StateRecord {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 40), uint64(sl.idleAt))
	return StateRecord{Key: key, Value: limit.AppendState(v, &sl.st)}
}

// RestoreState puts back one saved record, at now, before the store serves:
// a record already expired at now is skipped (it reports false), one that
// does not decode is an error naming the key. A key the store already holds
// is overwritten. It does not mark the key changed.
func (s *Memory) RestoreState(now int64, key string, value []byte) (bool, error) {
	if len(value) < 8 {
		return false, fmt.Errorf("store: saved state of %q: %d bytes, too short", key, len(value))
	}
	idleAt := int64(binary.BigEndian.Uint64(value))
	if idleAt <= now {
		return false, nil
	}
	st, err := limit.DecodeState(value[8:])
	if err != nil {
		return false, fmt.Errorf("store: saved state of %q: %w", key, err)
	}
	h := s.hash([]byte(key))
	sh := &s.shards[h>>56]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	i := sh.t.find(h)
	if i < 0 {
		if sh.t.n >= s.perShard && !sh.evict(s, h, now) {
			return false, nil // full of keys expiring later: this one is the least worth keeping
		}
		i = sh.t.insert(h, []byte(key))
	}
	sh.t.slots[i].st, sh.t.slots[i].idleAt = st, idleAt
	return true, nil
}

package edgelimitpb

import (
	"errors"
	"fmt"
)

// Revision is the newest schema revision this package understands. Raise it
// when a writer starts relying on a field whose loss would lose counts or bits,
// and have such writers set required_revision (rule 4 in edgelimit.proto).
const Revision = 1

// ErrNewerRevision is returned, wrapped, by Validate for a message whose
// required_revision is newer than Revision: applying only the fields this
// package knows could lose counts, so the message must be dropped.
var ErrNewerRevision = errors.New("edgelimitpb: message requires a newer schema revision")

// checkRevision returns an error wrapping ErrNewerRevision when required,
// the required_revision of a message of the given kind from replica, is newer
// than Revision. 0 means revision 1.
func checkRevision(kind, replica string, required uint32) error {
	if required > Revision {
		return fmt.Errorf("edgelimitpb: %s from %q requires revision %d, this reader knows %d: %w", kind, replica, required, Revision, ErrNewerRevision)
	}
	return nil
}

// Validate reports whether b can be applied: it names its replica, it
// requires no newer Revision, and every window's keys and counts have the
// same length. It does not check for repeated windows or keys, which a
// max-join absorbs. A nil b is invalid.
func (b *DeltaBatch) Validate() error {
	if b == nil {
		return errors.New("edgelimitpb: nil delta batch")
	}
	if err := checkRevision("delta batch", b.GetReplica(), b.GetRequiredRevision()); err != nil {
		return err
	}
	if b.GetReplica() == "" {
		return fmt.Errorf("edgelimitpb: delta batch seq %d names no replica", b.GetSeq())
	}
	for i, w := range b.GetWindows() {
		if w == nil {
			return fmt.Errorf("edgelimitpb: delta batch from %q: window group %d is nil", b.GetReplica(), i)
		}
		if nk, nc := len(w.GetKeys()), len(w.GetCounts()); nk != nc {
			return fmt.Errorf("edgelimitpb: delta batch from %q: window %d has %d keys but %d counts", b.GetReplica(), w.GetWindow(), nk, nc)
		}
	}
	return nil
}

// Add appends the slot (key, window, count) to b, in the group of its window,
// creating the group at the end when b has none. key is stored, not copied:
// the caller must not modify it while b is in use. Add does not look for the
// key already being in the group; a batch is expected to carry each slot once.
func (b *DeltaBatch) Add(key []byte, window int64, count uint64) {
	// Scanning from the end finds the current window at once; a batch has
	// one or two windows (the current and the previous one).
	for i := len(b.Windows) - 1; i >= 0; i-- {
		if w := b.Windows[i]; w.Window == window {
			w.Keys = append(w.Keys, key)
			w.Counts = append(w.Counts, count)
			return
		}
	}
	b.Windows = append(b.Windows, &WindowSlots{Window: window, Keys: [][]byte{key}, Counts: []uint64{count}})
}

// Len returns the number of slots in b. It requires b to be valid
// (Validate); otherwise it counts keys.
func (b *DeltaBatch) Len() int {
	n := 0
	for _, w := range b.GetWindows() {
		n += len(w.GetKeys())
	}
	return n
}

// Range calls fn for each slot of b, group by group in order, until fn
// returns false. key aliases b's storage: copy it to keep it. On a batch that
// fails Validate, Range stops each group at its shorter array.
func (b *DeltaBatch) Range(fn func(key []byte, window int64, count uint64) bool) {
	for _, w := range b.GetWindows() {
		keys, counts := w.GetKeys(), w.GetCounts()
		n := min(len(keys), len(counts))
		for i := range n {
			if !fn(keys[i], w.GetWindow(), counts[i]) {
				return
			}
		}
	}
}

// Validate reports whether b can be applied: it names its replica, requires
// no newer Revision, and has no nil bit. A nil b is invalid.
func (b *MitigationBatch) Validate() error {
	if b == nil {
		return errors.New("edgelimitpb: nil mitigation batch")
	}
	if err := checkRevision("mitigation batch", b.GetReplica(), b.GetRequiredRevision()); err != nil {
		return err
	}
	if b.GetReplica() == "" {
		return errors.New("edgelimitpb: mitigation batch names no replica")
	}
	for i, bit := range b.GetBits() {
		if bit == nil {
			return fmt.Errorf("edgelimitpb: mitigation batch from %q: bit %d is nil", b.GetReplica(), i)
		}
	}
	return nil
}

// Validate reports whether s can be applied: it names its taker, requires no
// newer Revision, every ReplicaSlots names its replica and no bit is nil. It
// does not check for a replica listed twice, which a max-join absorbs. A nil
// s is invalid.
func (s *Snapshot) Validate() error {
	if s == nil {
		return errors.New("edgelimitpb: nil snapshot")
	}
	if err := checkRevision("snapshot", s.GetReplica(), s.GetRequiredRevision()); err != nil {
		return err
	}
	if s.GetReplica() == "" {
		return errors.New("edgelimitpb: snapshot names no replica")
	}
	for i, r := range s.GetReplicas() {
		if r.GetReplica() == "" {
			return fmt.Errorf("edgelimitpb: snapshot from %q: replica entry %d names no replica", s.GetReplica(), i)
		}
	}
	for i, bit := range s.GetBits() {
		if bit == nil {
			return fmt.Errorf("edgelimitpb: snapshot from %q: bit %d is nil", s.GetReplica(), i)
		}
	}
	return nil
}

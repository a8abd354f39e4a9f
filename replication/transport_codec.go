package replication

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/edgelimit/edgelimit/crdt"
	edgelimitpb "github.com/edgelimit/edgelimit/proto"
)

// Per-message overhead reserved for the fields of a DeltaBatch or Snapshot
// other than the slots (names, seq, times, required_revision), on top of the
// names' lengths.
const msgOverhead = 64

// deltaChunk is one encoded DeltaBatch and the slots it carries.
type deltaChunk struct {
	seq   uint64
	data  []byte
	slots []crdt.Slot
}

// The field numbers of DeltaBatch and WindowSlots, read from the generated
// descriptors so the hand-written codec below cannot drift from
// edgelimit.proto. A field that is not there reads as 0, which
// TestCodecFields reports; the size estimates below also need every number
// to take a one-byte tag (below 16).
var (
	fBatchReplica  = deltaField("replica")
	fBatchRegion   = deltaField("region")
	fBatchSeq      = deltaField("seq")
	fBatchSent     = deltaField("sent_unix_nano")
	fBatchWindows  = deltaField("windows")
	fBatchRequired = deltaField("required_revision")
	fGroupWindow   = groupField("window")
	fGroupKeys     = groupField("keys")
	fGroupCounts   = groupField("counts")
)

func deltaField(name protoreflect.Name) protowire.Number {
	return fieldNumber((*edgelimitpb.DeltaBatch)(nil).ProtoReflect().Descriptor(), name)
}

func groupField(name protoreflect.Name) protowire.Number {
	return fieldNumber((*edgelimitpb.WindowSlots)(nil).ProtoReflect().Descriptor(), name)
}

func fieldNumber(md protoreflect.MessageDescriptor, name protoreflect.Name) protowire.Number {
	if fd := md.Fields().ByName(name); fd != nil {
		return fd.Number()
	}
	return 0
}

// encodeDeltas encodes slots, all of replica, into DeltaBatch messages of at
// most maxBytes each, numbered from seq up, and hands each to emit as soon as
// it is encoded, so the first can be on the wire while the next is built. It
// stops at the first error emit returns and returns it. Slots too large to
// fit any message (a key near maxBytes) are left out and returned. slots may
// come in any order; encodeDeltas may reorder them (by window).
//
// The encoding is the protobuf encoding of edgelimitpb.DeltaBatch (one
// WindowSlots per run of slots of one window, counts packed), written
// directly instead of through proto.Marshal: at a million slots a second the
// intermediate messages and per-key copies cost more than the rest of a flush.
func encodeDeltas(slots []crdt.Slot, replica, region string, seq uint64, sentUnixNano int64, maxBytes int, emit func(deltaChunk) error) (oversized []crdt.Slot, err error) {
	budget := maxBytes - msgOverhead - len(replica) - len(region)
	if budget <= 0 {
		return nil, fmt.Errorf("replication: message size limit %d leaves no room for slots", maxBytes)
	}
	byWindow := func(a, b crdt.Slot) int { return cmp.Compare(a.Window, b.Window) }
	if !slices.IsSortedFunc(slots, byWindow) {
		slices.SortStableFunc(slots, byWindow)
	}
	kept := slots
	for i, s := range slots {
		if deltaSlotSize(s)+deltaGroupSize > budget {
			if oversized == nil {
				kept = slices.Clone(slots[:i])
			}
			oversized = append(oversized, s)
		} else if oversized != nil {
			kept = append(kept, s)
		}
	}
	start, size := 0, 0
	for i, s := range kept {
		n := deltaSlotSize(s)
		if i == start || s.Window != kept[i-1].Window {
			n += deltaGroupSize
		}
		if i > start && size+n > budget {
			if err := emit(deltaChunk{seq: seq, data: appendDeltaBatch(nil, replica, region, seq, sentUnixNano, kept[start:i]), slots: kept[start:i:i]}); err != nil {
				return oversized, err
			}
			seq++
			start, size = i, deltaSlotSize(s)+deltaGroupSize
			continue
		}
		size += n
	}
	if start < len(kept) {
		if err := emit(deltaChunk{seq: seq, data: appendDeltaBatch(nil, replica, region, seq, sentUnixNano, kept[start:]), slots: kept[start:len(kept):len(kept)]}); err != nil {
			return oversized, err
		}
	}
	return oversized, nil
}

// appendDeltaBatch appends the encoding of a DeltaBatch of slots, which are
// ordered by window, to dst.
func appendDeltaBatch(dst []byte, replica, region string, seq uint64, sentUnixNano int64, slots []crdt.Slot) []byte {
	size := 0
	if replica != "" {
		size += protowire.SizeTag(fBatchReplica) + protowire.SizeBytes(len(replica))
	}
	if region != "" {
		size += protowire.SizeTag(fBatchRegion) + protowire.SizeBytes(len(region))
	}
	if seq != 0 {
		size += protowire.SizeTag(fBatchSeq) + protowire.SizeVarint(seq)
	}
	if sentUnixNano != 0 {
		size += protowire.SizeTag(fBatchSent) + protowire.SizeVarint(uint64(sentUnixNano))
	}
	forGroups(slots, func(g []crdt.Slot) {
		size += protowire.SizeTag(fBatchWindows) + protowire.SizeBytes(groupSize(g))
	})
	if dst == nil {
		dst = make([]byte, 0, size)
	}
	if replica != "" {
		dst = protowire.AppendTag(dst, fBatchReplica, protowire.BytesType)
		dst = protowire.AppendString(dst, replica)
	}
	if region != "" {
		dst = protowire.AppendTag(dst, fBatchRegion, protowire.BytesType)
		dst = protowire.AppendString(dst, region)
	}
	if seq != 0 {
		dst = protowire.AppendTag(dst, fBatchSeq, protowire.VarintType)
		dst = protowire.AppendVarint(dst, seq)
	}
	if sentUnixNano != 0 {
		dst = protowire.AppendTag(dst, fBatchSent, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(sentUnixNano))
	}
	forGroups(slots, func(g []crdt.Slot) {
		dst = protowire.AppendTag(dst, fBatchWindows, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(groupSize(g)))
		if w := g[0].Window; w != 0 {
			dst = protowire.AppendTag(dst, fGroupWindow, protowire.VarintType)
			dst = protowire.AppendVarint(dst, uint64(w))
		}
		for _, s := range g {
			dst = protowire.AppendTag(dst, fGroupKeys, protowire.BytesType)
			dst = protowire.AppendString(dst, s.Key)
		}
		dst = protowire.AppendTag(dst, fGroupCounts, protowire.BytesType)
		dst = protowire.AppendVarint(dst, uint64(countsSize(g)))
		for _, s := range g {
			dst = protowire.AppendVarint(dst, s.Count)
		}
	})
	return dst
}

// forGroups calls fn with each run of slots of one window.
func forGroups(slots []crdt.Slot, fn func([]crdt.Slot)) {
	for start := 0; start < len(slots); {
		end := start + 1
		for end < len(slots) && slots[end].Window == slots[start].Window {
			end++
		}
		fn(slots[start:end])
		start = end
	}
}

// groupSize is the encoded size of a WindowSlots of g, one window's slots.
func groupSize(g []crdt.Slot) int {
	n := 0
	if w := g[0].Window; w != 0 {
		n += protowire.SizeTag(fGroupWindow) + protowire.SizeVarint(uint64(w))
	}
	for _, s := range g {
		n += protowire.SizeTag(fGroupKeys) + protowire.SizeBytes(len(s.Key))
	}
	return n + protowire.SizeTag(fGroupCounts) + protowire.SizeBytes(countsSize(g))
}

func countsSize(g []crdt.Slot) int {
	n := 0
	for _, s := range g {
		n += protowire.SizeVarint(s.Count)
	}
	return n
}

// deltaGroupSize bounds the bytes of one WindowSlots group besides its
// slots: the group's tag and length, the window field, and the packed
// counts' tag and length.
const deltaGroupSize = 1 + 5 + 1 + 10 + 1 + 5

// deltaSlotSize is the bytes one slot takes in a WindowSlots group: the key
// with its tag and length, and the count's varint in the packed counts.
func deltaSlotSize(s crdt.Slot) int {
	return 1 + protowire.SizeVarint(uint64(len(s.Key))) + len(s.Key) + protowire.SizeVarint(s.Count)
}

// snapshotSlotSize is the bytes one slot takes in a ReplicaSlots, as an
// embedded Slot message with its tag and length.
func snapshotSlotSize(s crdt.Slot) int {
	n := 1 + protowire.SizeVarint(uint64(len(s.Key))) + len(s.Key) +
		1 + protowire.SizeVarint(uint64(s.Window)) +
		1 + protowire.SizeVarint(s.Count)
	return 1 + protowire.SizeVarint(uint64(n)) + n
}

// encodeSnapshots encodes slots, all of replica, as Snapshot messages of at
// most maxBytes each; slots that cannot fit any message are left out and
// returned.
func encodeSnapshots(slots []crdt.Slot, replica, region string, takenUnixNano int64, maxBytes int) (msgs [][]byte, nslots []int, oversized []crdt.Slot, err error) {
	budget := maxBytes - 2*msgOverhead - 2*len(replica) - len(region)
	if budget <= 0 {
		return nil, nil, nil, fmt.Errorf("replication: message size limit %d leaves no room for slots", maxBytes)
	}
	var (
		rs   *edgelimitpb.ReplicaSlots
		size int
	)
	finish := func() error {
		data, err := proto.Marshal(&edgelimitpb.Snapshot{
			Replica: replica, Region: region, TakenUnixNano: takenUnixNano,
			Replicas: []*edgelimitpb.ReplicaSlots{rs},
		})
		if err != nil {
			return fmt.Errorf("replication: encode snapshot of %q: %w", replica, err)
		}
		msgs = append(msgs, data)
		nslots = append(nslots, len(rs.Slots))
		rs = nil
		return nil
	}
	for _, s := range slots {
		n := snapshotSlotSize(s)
		if n > budget {
			oversized = append(oversized, s)
			continue
		}
		if rs != nil && size+n > budget {
			if err := finish(); err != nil {
				return nil, nil, nil, err
			}
		}
		if rs == nil {
			rs = &edgelimitpb.ReplicaSlots{Replica: replica}
			size = 0
		}
		rs.Slots = append(rs.Slots, &edgelimitpb.Slot{Key: []byte(s.Key), Window: s.Window, Count: s.Count})
		size += n
	}
	if rs != nil {
		if err := finish(); err != nil {
			return nil, nil, nil, err
		}
	}
	return msgs, nslots, oversized, nil
}

// decodeError is why a received message cannot be applied.
type decodeError struct {
	reason DropReason
	err    error
}

func (e *decodeError) Error() string { return e.reason.String() + ": " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// validationReason maps a Validate error to its drop reason.
func validationReason(err error) DropReason {
	if errors.Is(err, edgelimitpb.ErrNewerRevision) {
		return DropRevision
	}
	return DropInvalid
}

// decodeDelta decodes and validates a DeltaBatch sent on the subject of
// (region, pop), and returns its slots and its sent time.
//
// It reads the protobuf encoding directly (see parseDeltaBatch), in two
// passes over each window group (check and count, then fill), and accepts and
// rejects exactly what proto.Unmarshal followed by Validate does, which
// FuzzDecodeDelta checks; it allocates one string per key and the result.
func decodeDelta(data []byte, region, pop string) ([]crdt.Slot, int64, error) {
	b, err := parseDeltaBatch(data)
	if err != nil {
		return nil, 0, &decodeError{DropDecode, fmt.Errorf("delta batch from %s/%s: %w", region, pop, err)}
	}
	if err := b.validate(); err != nil {
		return nil, 0, &decodeError{validationReason(err), err}
	}
	if b.replica != pop || b.region != region {
		return nil, 0, &decodeError{DropMismatch, fmt.Errorf("delta batch seq %d names %s/%s but came on the subject of %s/%s",
			b.seq, b.region, b.replica, region, pop)}
	}
	n := 0
	for _, g := range b.groups {
		n += g.n
	}
	slots := make([]crdt.Slot, n)
	base := 0
	for _, g := range b.groups {
		ki, ci := base, base
		// The group parsed once already; walking it again cannot fail.
		_, _, _, _ = walkGroup(g.data, func(key []byte) {
			slots[ki] = crdt.Slot{Key: string(key), Window: g.window, Replica: b.replica}
			ki++
		}, func(count uint64) {
			slots[ci].Count = count
			ci++
		})
		base += g.n
	}
	return slots, b.sent, nil
}

// rawBatch is a DeltaBatch as parseDeltaBatch reads it: the header fields,
// and each window group's encoding with its window and shape.
type rawBatch struct {
	replica, region string
	seq             uint64
	sent            int64
	required        uint32
	groups          []rawGroup
}

type rawGroup struct {
	data           []byte // the WindowSlots encoding, aliasing the input
	window         int64
	nkeys, ncounts int
	n              int // min(nkeys, ncounts): the slots the group yields
}

var errUTF8 = errors.New("string field contains invalid UTF-8")

// parseDeltaBatch parses the protobuf encoding of an edgelimitpb.DeltaBatch
// the way proto.Unmarshal does: the last value of a scalar field wins,
// repeated fields accumulate, counts may be packed or not, a known field with
// an unexpected wire type and any unknown field are skipped, and string
// fields must be valid UTF-8.
func parseDeltaBatch(data []byte) (*rawBatch, error) {
	b := &rawBatch{}
	for len(data) > 0 {
		num, typ, n, err := consumeTag(data)
		if err != nil {
			return nil, err
		}
		data = data[n:]
		switch {
		case (num == fBatchReplica || num == fBatchRegion) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			if !utf8.Valid(v) {
				return nil, errUTF8
			}
			if num == fBatchReplica {
				b.replica = string(v)
			} else {
				b.region = string(v)
			}
			data = data[n:]
		case (num == fBatchSeq || num == fBatchSent || num == fBatchRequired) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			switch num {
			case fBatchSeq:
				b.seq = v
			case fBatchSent:
				b.sent = int64(v)
			default:
				b.required = uint32(v)
			}
			data = data[n:]
		case num == fBatchWindows && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			g := rawGroup{data: v}
			var err error
			if g.window, g.nkeys, g.ncounts, err = walkGroup(v, nil, nil); err != nil {
				return nil, err
			}
			g.n = min(g.nkeys, g.ncounts)
			b.groups = append(b.groups, g)
			data = data[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			data = data[n:]
		}
	}
	return b, nil
}

// consumeTag is protowire.ConsumeTag with the checks proto.Unmarshal adds: a
// field number above protowire.MaxValidNumber, and an end-group marker
// outside a group, are errors.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int, error) {
	num, typ, n := protowire.ConsumeTag(b)
	switch {
	case n < 0:
		return 0, 0, 0, protowire.ParseError(n)
	case num > protowire.MaxValidNumber:
		return 0, 0, 0, fmt.Errorf("invalid field number %d", num)
	case typ == protowire.EndGroupType:
		return 0, 0, 0, fmt.Errorf("end of group %d outside a group", num)
	}
	return num, typ, n, nil
}

// walkGroup parses one WindowSlots, calling onKey for each key (aliasing
// data) and onCount for each count, in order, when they are not nil, and
// returns its window and how many keys and counts it has.
func walkGroup(data []byte, onKey func([]byte), onCount func(uint64)) (window int64, nkeys, ncounts int, err error) {
	for len(data) > 0 {
		num, typ, n, err := consumeTag(data)
		if err != nil {
			return 0, 0, 0, err
		}
		data = data[n:]
		switch {
		case num == fGroupWindow && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return 0, 0, 0, protowire.ParseError(n)
			}
			window = int64(v)
			data = data[n:]
		case num == fGroupKeys && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return 0, 0, 0, protowire.ParseError(n)
			}
			if onKey != nil {
				onKey(v)
			}
			nkeys++
			data = data[n:]
		case num == fGroupCounts && typ == protowire.BytesType: // packed
			v, n := protowire.ConsumeBytes(data)
			if n < 0 {
				return 0, 0, 0, protowire.ParseError(n)
			}
			for len(v) > 0 {
				c, m := protowire.ConsumeVarint(v)
				if m < 0 {
					return 0, 0, 0, protowire.ParseError(m)
				}
				if onCount != nil {
					onCount(c)
				}
				ncounts++
				v = v[m:]
			}
			data = data[n:]
		case num == fGroupCounts && typ == protowire.VarintType: // not packed
			c, n := protowire.ConsumeVarint(data)
			if n < 0 {
				return 0, 0, 0, protowire.ParseError(n)
			}
			if onCount != nil {
				onCount(c)
			}
			ncounts++
			data = data[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, data)
			if n < 0 {
				return 0, 0, 0, protowire.ParseError(n)
			}
			data = data[n:]
		}
	}
	return window, nkeys, ncounts, nil
}

// validate is edgelimitpb.DeltaBatch.Validate on a rawBatch, with the same
// errors.
func (b *rawBatch) validate() error {
	pb := &edgelimitpb.DeltaBatch{Replica: b.replica, Seq: b.seq, RequiredRevision: b.required}
	for _, g := range b.groups {
		if g.nkeys != g.ncounts {
			// Let Validate phrase the error, on a group of the same shape.
			pb.Windows = []*edgelimitpb.WindowSlots{{Window: g.window, Keys: make([][]byte, g.nkeys), Counts: make([]uint64, g.ncounts)}}
			break
		}
	}
	return pb.Validate()
}

// decodeSnapshot decodes and validates a Snapshot sent on the subject of
// (region, pop), and returns its slots except those of replica skip.
func decodeSnapshot(data []byte, region, pop, skip string) ([]crdt.Slot, error) {
	slots, _, err := decodeSnapshotBits(data, region, pop, skip)
	return slots, err
}

// decodeSnapshotBits is decodeSnapshot that also returns the snapshot's
// mitigation bits, unfiltered (the caller filters them by scope, origin and
// time; see Replicator.applyBits).
func decodeSnapshotBits(data []byte, region, pop, skip string) ([]crdt.Slot, []wireBit, error) {
	var s edgelimitpb.Snapshot
	if err := proto.Unmarshal(data, &s); err != nil {
		return nil, nil, &decodeError{DropDecode, fmt.Errorf("snapshot from %s/%s: %w", region, pop, err)}
	}
	if err := s.Validate(); err != nil {
		return nil, nil, &decodeError{validationReason(err), err}
	}
	if s.GetReplica() != pop || s.GetRegion() != region {
		return nil, nil, &decodeError{DropMismatch, fmt.Errorf("snapshot names %s/%s but came on the subject of %s/%s",
			s.GetRegion(), s.GetReplica(), region, pop)}
	}
	bits := fromWireBits(s.GetBits(), pop)
	var slots []crdt.Slot
	for _, rs := range s.GetReplicas() {
		replica := rs.GetReplica()
		if replica == skip {
			continue
		}
		for _, sl := range rs.GetSlots() {
			slots = append(slots, crdt.Slot{Key: string(sl.GetKey()), Window: sl.GetWindow(), Replica: replica, Count: sl.GetCount()})
		}
	}
	return slots, bits, nil
}

// wireBit is a received mitigation bit with its wire-only fields: the scope
// as sent (it may not fit crdt.Bit.Scope) and the origin's issue time.
type wireBit struct {
	bit    crdt.Bit
	scope  uint32
	issued int64 // unix nanoseconds; 0 when the sender did not say
}

// fromWireBits converts decoded MitigationBits, which Validate has checked
// are not nil; a bit that names no origin is taken to be the sender's.
func fromWireBits(in []*edgelimitpb.MitigationBit, sender string) []wireBit {
	if len(in) == 0 {
		return nil
	}
	out := make([]wireBit, 0, len(in))
	for _, b := range in {
		origin := b.GetOrigin()
		if origin == "" {
			origin = sender
		}
		out = append(out, wireBit{
			bit:    crdt.Bit{Key: string(b.GetKey()), Scope: uint8(min(b.GetScope(), 255)), Until: b.GetUntilUnixNano(), Origin: origin},
			scope:  b.GetScope(),
			issued: b.GetIssuedUnixNano(),
		})
	}
	return out
}

// toWireBit converts an own bit for publishing, stamped with issued.
func toWireBit(b crdt.Bit, issued int64) *edgelimitpb.MitigationBit {
	return &edgelimitpb.MitigationBit{Key: []byte(b.Key), Scope: uint32(b.Scope), UntilUnixNano: b.Until, Origin: b.Origin, IssuedUnixNano: issued}
}

// wireBitSize is the bytes one bit takes in a MitigationBatch or Snapshot,
// as an embedded message with its tag and length.
func wireBitSize(m *edgelimitpb.MitigationBit) int {
	n := proto.Size(m)
	return 1 + protowire.SizeVarint(uint64(n)) + n
}

// bitsChunk is one encoded MitigationBatch and the bits it carries.
type bitsChunk struct {
	data []byte
	bits []crdt.Bit
}

// encodeBits encodes bits as MitigationBatch messages of replica of at most
// maxBytes each, every bit stamped issued_unix_nano = issued. Bits too large
// to fit any message (a key near maxBytes) are left out and returned.
func encodeBits(bits []crdt.Bit, replica string, issued int64, maxBytes int) (chunks []bitsChunk, oversized []crdt.Bit, err error) {
	budget := maxBytes - msgOverhead - len(replica)
	if budget <= 0 {
		return nil, nil, fmt.Errorf("replication: message size limit %d leaves no room for bits", maxBytes)
	}
	var (
		batch *edgelimitpb.MitigationBatch
		in    []crdt.Bit
		size  int
	)
	finish := func() error {
		data, err := proto.Marshal(batch)
		if err != nil {
			return fmt.Errorf("replication: encode mitigation batch of %q: %w", replica, err)
		}
		chunks = append(chunks, bitsChunk{data: data, bits: in})
		batch, in = nil, nil
		return nil
	}
	for _, b := range bits {
		m := toWireBit(b, issued)
		n := wireBitSize(m)
		if n > budget {
			oversized = append(oversized, b)
			continue
		}
		if batch != nil && size+n > budget {
			if err := finish(); err != nil {
				return nil, nil, err
			}
		}
		if batch == nil {
			batch = &edgelimitpb.MitigationBatch{Replica: replica}
			size = 0
		}
		batch.Bits = append(batch.Bits, m)
		in = append(in, b)
		size += n
	}
	if batch != nil {
		if err := finish(); err != nil {
			return nil, nil, err
		}
	}
	return chunks, oversized, nil
}

// encodeSnapshotBits encodes bits as Snapshot messages of replica that carry
// only bits (no slots), of at most maxBytes each, stamped with issued; bits
// that cannot fit any message are left out. It returns the messages and how
// many bits each carries.
func encodeSnapshotBits(bits []crdt.Bit, replica, region string, issued int64, maxBytes int) (msgs [][]byte, nbits []int, err error) {
	chunks, _, err := encodeBits(bits, replica, issued, maxBytes-msgOverhead-len(region))
	if err != nil {
		return nil, nil, err
	}
	for _, c := range chunks {
		s := &edgelimitpb.Snapshot{Replica: replica, Region: region, TakenUnixNano: issued}
		for _, b := range c.bits {
			s.Bits = append(s.Bits, toWireBit(b, issued))
		}
		data, err := proto.Marshal(s)
		if err != nil {
			return nil, nil, fmt.Errorf("replication: encode snapshot bits of %q: %w", replica, err)
		}
		msgs = append(msgs, data)
		nbits = append(nbits, len(c.bits))
	}
	return msgs, nbits, nil
}

// decodeBits decodes and validates a MitigationBatch sent on the subject of
// (region, pop) and returns its bits, unfiltered.
func decodeBits(data []byte, region, pop string) ([]wireBit, error) {
	var b edgelimitpb.MitigationBatch
	if err := proto.Unmarshal(data, &b); err != nil {
		return nil, &decodeError{DropDecode, fmt.Errorf("mitigation batch from %s/%s: %w", region, pop, err)}
	}
	if err := b.Validate(); err != nil {
		return nil, &decodeError{validationReason(err), err}
	}
	if b.GetReplica() != pop {
		return nil, &decodeError{DropMismatch, fmt.Errorf("mitigation batch names %s but came on the subject of %s/%s",
			b.GetReplica(), region, pop)}
	}
	return fromWireBits(b.GetBits(), pop), nil
}

package quota

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"iter"
	"os"
	"path/filepath"
	"slices"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// A snapshot file is the on-disk form of a set of quotas at a version: a
// PoP's last snapshot of PostgreSQL (binary, below) and the embedded store's
// state (JSON lines, readable by hand: a header {"version":N,"count":M},
// then one quota per line as the admin API shows it). ReadSnapshot tells the
// two apart by their first bytes, so a PoP upgraded from a release that saved
// its PostgreSQL snapshot as JSON still starts from that file; its next save
// is binary.
//
// The binary form (format 1) is built to load a million quotas in a fraction
// of a second and to refuse any damage, never to load part of a file:
//
//	offset  size  field
//	0       8     magic "ELQSNAP\n"
//	8       4     format (1), uint32 little-endian
//	12      8     version (the store's audit id), int64 LE
//	20      8     count of quotas, uint64 LE
//	28      8     K, bytes of the key block, uint64 LE
//	36      8     N, bytes of the name block, uint64 LE
//	44      K     every API key, concatenated in record order
//	44+K    N     names (tiers and overridden limits, each once): uvarint
//	              count, then per name a uvarint length and its bytes
//	44+K+N  …     records, one per quota: uvarint key length, uvarint tier
//	              name index, varint effective_at, expires_at, updated_at
//	              (Unix ns, 0 unset), uvarint override count, then per
//	              override: uvarint name index, uvarint requests_per_unit,
//	              one byte unit (rules.Unit)
//	end-4   4     CRC-32C (Castagnoli) of every byte before it, uint32 LE
//
// Keys and names sit in blocks of their own so that the reader turns each
// block into one string and every key or name into a slice of it: loading
// allocates per block, not per quota.
const (
	snapMagic      = "ELQSNAP\n"
	snapFormat     = 1
	snapHeaderSize = 44
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshotDamaged is wrapped by ReadSnapshot's error for a file that is
// not a whole snapshot (torn, truncated, flipped bits, a bad field).
var ErrSnapshotDamaged = errors.New("quota: the snapshot file is damaged")

// writeSnapshot writes quotas at version to path in the binary form,
// atomically (see writeAtomic).
func writeSnapshot(path string, version int64, quotas []*Quota) error {
	return writeSnapshotOf(path, version, len(quotas), slices.Values(quotas))
}

// writeSnapshotOf is writeSnapshot of n quotas read from quotas, which may
// be read more than once and may yield one Quota value overwritten each
// time (an Index's snapshot: see snapshot.quotas).
func writeSnapshotOf(path string, version int64, n int, quotas iter.Seq[*Quota]) error {
	return writeAtomic(path, func(w io.Writer) error { return encodeSnapshot(w, version, n, quotas) })
}

// writeSnapshotJSON writes quotas at version to path as JSON lines,
// atomically: the embedded store's state, which people read.
func writeSnapshotJSON(path string, version int64, quotas []*Quota) error {
	return writeAtomic(path, func(w io.Writer) error {
		enc := json.NewEncoder(w) // one line per Encode
		err := enc.Encode(snapshotHeader{Version: version, Count: len(quotas)})
		for i := 0; i < len(quotas) && err == nil; i++ {
			err = enc.Encode(quotas[i].ToWire())
		}
		return err
	})
}

// writeAtomic writes path with write: a temporary file in the same
// directory, synced, renamed over path, and the directory synced, so that a
// crash leaves the old file or the new one, never a mix.
func writeAtomic(path string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, a no-op
	w := bufio.NewWriterSize(tmp, 1<<20)
	err = write(w)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// encodeSnapshot writes the binary form of the n quotas at version to w. It
// reads quotas three times, keeping nothing of a Quota but its strings.
func encodeSnapshot(w io.Writer, version int64, n int, quotas iter.Seq[*Quota]) error {
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 64<<10)
	names := map[string]uint64{}
	var nameBlock []byte
	name := func(s string) uint64 {
		i, ok := names[s]
		if !ok {
			i = uint64(len(names))
			names[s] = i
			nameBlock = binary.AppendUvarint(nameBlock, uint64(len(s)))
			nameBlock = append(nameBlock, s...)
		}
		return i
	}
	keyBytes := 0
	for q := range quotas {
		keyBytes += len(q.APIKey)
		name(q.Tier)
		for _, o := range q.Overrides {
			name(o.Descriptor)
		}
	}
	nameBlock = append(binary.AppendUvarint(nil, uint64(len(names))), nameBlock...)
	h := make([]byte, 0, snapHeaderSize)
	h = append(h, snapMagic...)
	h = binary.LittleEndian.AppendUint32(h, snapFormat)
	h = binary.LittleEndian.AppendUint64(h, uint64(version))
	h = binary.LittleEndian.AppendUint64(h, uint64(n))
	h = binary.LittleEndian.AppendUint64(h, uint64(keyBytes))
	h = binary.LittleEndian.AppendUint64(h, uint64(len(nameBlock)))
	bw.Write(h)
	for q := range quotas {
		bw.WriteString(q.APIKey)
	}
	bw.Write(nameBlock)
	var rec []byte
	for q := range quotas {
		rec = binary.AppendUvarint(rec[:0], uint64(len(q.APIKey)))
		rec = binary.AppendUvarint(rec, names[q.Tier])
		rec = binary.AppendVarint(rec, int64(q.EffectiveAt))
		rec = binary.AppendVarint(rec, int64(q.ExpiresAt))
		rec = binary.AppendVarint(rec, int64(q.UpdatedAt))
		rec = binary.AppendUvarint(rec, uint64(len(q.Overrides)))
		for _, o := range q.Overrides {
			rec = binary.AppendUvarint(rec, names[o.Descriptor])
			rec = binary.AppendUvarint(rec, uint64(o.RequestsPerUnit))
			rec = append(rec, byte(o.Unit))
		}
		bw.Write(rec)
	}
	if err := bw.Flush(); err != nil { // the writes before report here
		return err
	}
	_, err := w.Write(binary.LittleEndian.AppendUint32(nil, crc.Sum32()))
	return err
}

// ReadSnapshot reads a snapshot file, binary or JSON lines. A missing file
// is os.ErrNotExist; a damaged one an error naming the file and the problem
// (wrapping ErrSnapshotDamaged for the binary form; naming the line for
// JSON), and no quotas: a file is used whole or not at all.
func ReadSnapshot(path string) ([]*Quota, int64, error) {
	var out []*Quota
	var a slabs // see slabs: a quota is a few slab entries, not four objects
	v, err := readSnapshotEach(path, func(n, _ int) { out = make([]*Quota, 0, n) }, func(q *Quota) {
		held := a.quota()
		*held = *q
		held.APIKey, held.Overrides = a.str([]byte(q.APIKey)), a.overridesOf(q.Overrides)
		out = append(out, held)
	})
	if err != nil {
		return nil, 0, err
	}
	return out, v, nil
}

// readSnapshotEach reads a snapshot file as ReadSnapshot does, telling
// size the number of quotas and of key bytes, then passing each quota to
// fn in one Quota value overwritten by the next (fn copies what it keeps):
// an Index built so holds no second copy of a million quotas at the peak of
// the load. On an error fn may have seen some quotas, which the caller
// drops.
func readSnapshotEach(path string, size func(n, keyBytes int), fn func(*Quota)) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	head, _ := r.Peek(len(snapMagic))
	if string(head) != snapMagic {
		all, v, err := readSnapshotJSON(path, r)
		if err != nil {
			return 0, err
		}
		keyBytes := 0
		for _, q := range all {
			keyBytes += len(q.APIKey)
		}
		size(len(all), keyBytes)
		for _, q := range all {
			fn(q)
		}
		return v, nil
	}
	// One buffer of the file's size: growing one as it reads would leave
	// twice the file in garbage, at the load's peak of memory.
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("quota: %s: %w", path, err)
	}
	b := make([]byte, fi.Size())
	n, err := io.ReadFull(r, b)
	if err == io.ErrUnexpectedEOF { // shrunk since the Stat: damaged below
		err = nil
	}
	if err != nil {
		return 0, fmt.Errorf("quota: %s: %w", path, err)
	}
	v, err := decodeSnapshot(b[:n], size, fn)
	if err != nil {
		return 0, fmt.Errorf("quota: %s: %w", path, err)
	}
	return v, nil
}

// decodeSnapshot decodes a whole binary snapshot b, checksum first, as
// decodeSnapshotEach does.
func decodeSnapshot(b []byte, size func(n, keyBytes int), fn func(*Quota)) (int64, error) {
	if len(b) < snapHeaderSize+4 {
		return 0, fmt.Errorf("%w: %d bytes, shorter than a header", ErrSnapshotDamaged, len(b))
	}
	body := b[:len(b)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(b[len(b)-4:]); got != want {
		return 0, fmt.Errorf("%w: checksum %08x, the file says %08x (torn or altered)", ErrSnapshotDamaged, got, want)
	}
	return decodeSnapshotEach(body, size, fn)
}

// decodeSnapshotBody returns the quotas of a binary snapshot without its
// checksum (for the tests and the fuzzer).
func decodeSnapshotBody(b []byte) ([]*Quota, int64, error) {
	var out []*Quota
	v, err := decodeSnapshotEach(b, func(int, int) {}, func(q *Quota) { out = append(out, q.Clone()) })
	if err != nil {
		return nil, 0, err
	}
	return out, v, nil
}

// decodeSnapshotEach decodes a binary snapshot without its checksum, telling
// size the number of quotas and key bytes, then passing each quota to fn in
// one Quota value overwritten by the next. Every length and index is
// checked against what remains, every quota validated before fn sees it: a
// body that passed the checksum but was written wrong is an error too, never
// a panic.
func decodeSnapshotEach(b []byte, size func(n, keyBytes int), fn func(*Quota)) (int64, error) {
	damaged := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrSnapshotDamaged}, args...)...)
	}
	if len(b) < snapHeaderSize || string(b[:len(snapMagic)]) != snapMagic {
		return 0, damaged("no header")
	}
	if f := binary.LittleEndian.Uint32(b[8:]); f != snapFormat {
		return 0, fmt.Errorf("quota: snapshot format %d, this build reads format %d", f, snapFormat)
	}
	version := int64(binary.LittleEndian.Uint64(b[12:]))
	count := binary.LittleEndian.Uint64(b[20:])
	keyLen, nameLen := binary.LittleEndian.Uint64(b[28:]), binary.LittleEndian.Uint64(b[36:])
	rest := b[snapHeaderSize:]
	if keyLen > uint64(len(rest)) || nameLen > uint64(len(rest))-keyLen {
		return 0, damaged("blocks of %d and %d bytes in %d", keyLen, nameLen, len(rest))
	}
	// A record takes at least 6 bytes, a key at least 1: a count beyond
	// that is a lie, and must not size an allocation.
	if count > uint64(len(rest))/7 {
		return 0, damaged("%d quotas cannot fit in %d bytes", count, len(rest))
	}
	keys := string(rest[:keyLen])
	d := decoder{b: rest[keyLen : keyLen+nameLen]}
	nNames := d.uvarint()
	if nNames > uint64(len(d.b)) {
		return 0, damaged("%d names in a block of %d bytes", nNames, nameLen)
	}
	names := make([]string, nNames)
	for i := range names {
		n := d.uvarint()
		if d.err || n > uint64(len(d.b)) {
			return 0, damaged("name %d overruns its block", i)
		}
		names[i] = string(d.b[:n]) // names are few: a copy each
		d.b = d.b[n:]
	}
	if d.err || len(d.b) != 0 {
		return 0, damaged("the name block does not end where its length says")
	}
	name := func(i uint64) (string, bool) {
		if i >= uint64(len(names)) {
			return "", false
		}
		return names[i], true
	}
	d = decoder{b: rest[keyLen+nameLen:]}
	size(int(count), int(keyLen))
	var q Quota
	var overrides [MaxOverrides]Override
	keyAt := 0
	for i := range count {
		kl := d.uvarint()
		if d.err || kl > uint64(len(keys)-keyAt) {
			return 0, damaged("quota %d: its key overruns the key block", i)
		}
		q.APIKey = keys[keyAt : keyAt+int(kl)]
		keyAt += int(kl)
		tier, ok := name(d.uvarint())
		q.Tier = tier
		q.EffectiveAt, q.ExpiresAt, q.UpdatedAt = Time(d.varint()), Time(d.varint()), Time(d.varint())
		n := d.uvarint()
		if !ok || d.err || n > MaxOverrides {
			return 0, damaged("quota %d (%q): bad tier or override count", i, q.APIKey)
		}
		q.Overrides = overrides[:n:n]
		if n > 0 {
			for j := range q.Overrides {
				o := &q.Overrides[j]
				o.Descriptor, ok = name(d.uvarint())
				rpu := d.uvarint()
				u := d.byte()
				if !ok || d.err || rpu > MaxRequestsPerUnit {
					return 0, damaged("quota %d (%q): override %d is bad", i, q.APIKey, j)
				}
				o.RequestsPerUnit, o.Unit = int64(rpu), rules.Unit(u)
			}
		}
		if err := q.Validate(); err != nil {
			return 0, damaged("quota %d (%q): %v", i, q.APIKey, err)
		}
		fn(&q)
	}
	if keyAt != len(keys) || len(d.b) != 0 {
		return 0, damaged("%d key bytes and %d record bytes left over", len(keys)-keyAt, len(d.b))
	}
	return version, nil
}

// decoder reads varints from b; past its end or at a bad varint it sets err
// and returns zeros, so that a caller checks once per record.
type decoder struct {
	b   []byte
	err bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) == 0 {
		d.err = true
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// snapshotHeader is the first line of the JSON form.
type snapshotHeader struct {
	Version int64 `json:"version"`
	Count   int   `json:"count"`
}

// readSnapshotJSON reads the JSON-lines form from r, the file at path.
func readSnapshotJSON(path string, r io.Reader) ([]*Quota, int64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var h snapshotHeader
	if !sc.Scan() {
		return nil, 0, fmt.Errorf("quota: %s is damaged: no header line (%v)", path, sc.Err())
	}
	if err := strictUnmarshal(sc.Bytes(), &h); err != nil {
		return nil, 0, fmt.Errorf("quota: %s:1 is damaged: %w", path, err)
	}
	out := make([]*Quota, 0, min(h.Count, 1<<20))
	in := interner{}
	var a slabs // see slabs: a held quota is a few slab entries, not four objects
	line := 1
	for sc.Scan() {
		line++
		var w Wire
		if err := json.Unmarshal(sc.Bytes(), &w); err != nil {
			return nil, 0, fmt.Errorf("quota: %s:%d is damaged: %w", path, line, err)
		}
		q, err := FromWire("", &w)
		if err != nil {
			return nil, 0, fmt.Errorf("quota: %s:%d: %w", path, line, err)
		}
		for j := range q.Overrides {
			q.Overrides[j].Descriptor = in.get([]byte(q.Overrides[j].Descriptor))
		}
		held := a.quota()
		held.APIKey, held.Tier, held.Overrides = a.str([]byte(q.APIKey)), in.get([]byte(q.Tier)), a.overridesOf(q.Overrides)
		held.EffectiveAt, held.ExpiresAt, held.UpdatedAt = q.EffectiveAt, q.ExpiresAt, q.UpdatedAt
		out = append(out, held)
	}
	if err := sc.Err(); err != nil {
		return nil, 0, fmt.Errorf("quota: %s:%d: %w", path, line+1, err)
	}
	if len(out) != h.Count {
		return nil, 0, fmt.Errorf("quota: %s is damaged: the header counts %d quotas, the file holds %d", path, h.Count, len(out))
	}
	return out, h.Version, nil
}

func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

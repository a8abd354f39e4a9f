package strong

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Bounds on what a Request may carry; a decoded message past them is
// refused.
const (
	// MaxKeyBytes bounds a request's key.
	MaxKeyBytes = 4096
	// MaxHits bounds a request's hits.
	MaxHits = 1 << 40
	// MaxLimit bounds a spec's limit and burst.
	MaxLimit = 1 << 40
	// MaxAlgorithm is the largest algorithm code (pop/limit's Algorithm).
	MaxAlgorithm = 7
)

// Spec is how the home counts a key: the limit's algorithm (pop/limit's
// Algorithm code, opaque here), its limit per window, its window in ns and
// its burst.
type Spec struct {
	Algorithm            uint8
	Limit, Window, Burst int64
}

// Request asks a key's home to decide hits of Key under Spec. ID is the
// asker's own number for the request, which the reply repeats.
type Request struct {
	ID   uint64
	Key  string
	Spec Spec
	Hits int64
}

// Reply is the home's decision on a Request: the request's ID and key,
// whether the hits were admitted (and counted), what remains, when the
// window or bucket resets and, when denied, when to retry (ns).
type Reply struct {
	ID                      uint64
	Key                     string
	Allowed                 bool
	Remaining, Reset, Retry int64
}

// ErrMalformed is wrapped by every decoding and checking error.
var ErrMalformed = errors.New("strong: malformed message")

const (
	requestTag byte = 'Q'
	replyTag   byte = 'R'
)

// Validate reports whether r can be decided.
func (r *Request) Validate() error {
	s := r.Spec
	switch {
	case r.Key == "":
		return fmt.Errorf("%w: empty key", ErrMalformed)
	case len(r.Key) > MaxKeyBytes:
		return fmt.Errorf("%w: key of %d bytes, at most %d", ErrMalformed, len(r.Key), MaxKeyBytes)
	case r.Hits < 0 || r.Hits > MaxHits:
		return fmt.Errorf("%w: hits %d not in 0…%d", ErrMalformed, r.Hits, int64(MaxHits))
	case s.Algorithm > MaxAlgorithm:
		return fmt.Errorf("%w: algorithm %d", ErrMalformed, s.Algorithm)
	case s.Limit < 0 || s.Limit > MaxLimit:
		return fmt.Errorf("%w: limit %d not in 0…%d", ErrMalformed, s.Limit, int64(MaxLimit))
	case s.Burst < 0 || s.Burst > MaxLimit:
		return fmt.Errorf("%w: burst %d not in 0…%d", ErrMalformed, s.Burst, int64(MaxLimit))
	case s.Window <= 0:
		return fmt.Errorf("%w: window %dns not positive", ErrMalformed, s.Window)
	}
	return nil
}

// AppendRequest appends r's encoding to dst.
func AppendRequest(dst []byte, r *Request) []byte {
	dst = append(dst, requestTag)
	dst = binary.AppendUvarint(dst, r.ID)
	dst = append(dst, r.Spec.Algorithm)
	dst = binary.AppendVarint(dst, r.Spec.Limit)
	dst = binary.AppendVarint(dst, r.Spec.Window)
	dst = binary.AppendVarint(dst, r.Spec.Burst)
	dst = binary.AppendVarint(dst, r.Hits)
	dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
	return append(dst, r.Key...)
}

// DecodeRequest decodes and validates a request.
func DecodeRequest(b []byte) (Request, error) {
	var r Request
	d := decoder{b: b}
	if d.byte() != requestTag {
		return r, fmt.Errorf("%w: not a request", ErrMalformed)
	}
	r.ID = d.uvarint()
	r.Spec.Algorithm = d.byte()
	r.Spec.Limit, r.Spec.Window, r.Spec.Burst, r.Hits = d.varint(), d.varint(), d.varint(), d.varint()
	r.Key = d.str()
	if err := d.done(); err != nil {
		return Request{}, err
	}
	if err := r.Validate(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// AppendReply appends r's encoding to dst.
func AppendReply(dst []byte, r *Reply) []byte {
	dst = append(dst, replyTag)
	dst = binary.AppendUvarint(dst, r.ID)
	var allowed byte
	if r.Allowed {
		allowed = 1
	}
	dst = append(dst, allowed)
	dst = binary.AppendVarint(dst, r.Remaining)
	dst = binary.AppendVarint(dst, r.Reset)
	dst = binary.AppendVarint(dst, r.Retry)
	dst = binary.AppendUvarint(dst, uint64(len(r.Key)))
	return append(dst, r.Key...)
}

// DecodeReply decodes a reply; CheckReply holds it to its request.
func DecodeReply(b []byte) (Reply, error) {
	var r Reply
	d := decoder{b: b}
	if d.byte() != replyTag {
		return r, fmt.Errorf("%w: not a reply", ErrMalformed)
	}
	r.ID = d.uvarint()
	switch d.byte() {
	case 0:
	case 1:
		r.Allowed = true
	default:
		d.fail("allowed flag")
	}
	r.Remaining, r.Reset, r.Retry = d.varint(), d.varint(), d.varint()
	r.Key = d.str()
	if err := d.done(); err != nil {
		return Reply{}, err
	}
	return r, nil
}

// CheckReply reports whether rep can answer req: the same id and key, a
// remaining room within the limit (or the burst), a reset and retry within
// what the limit could ask (a window, or the time to refill a whole bucket:
// the window times the capacity over the limit), no retry on an admission.
// A reply that fails is dropped: the check waits on, and times out.
func CheckReply(req *Request, rep *Reply) error {
	capacity := max(req.Spec.Limit, req.Spec.Burst)
	longest := req.Spec.Window
	if req.Spec.Limit > 0 && capacity > req.Spec.Limit {
		longest = req.Spec.Window / req.Spec.Limit * capacity
	}
	longest = max(longest, 2*req.Spec.Window) // a sliding window resets within two
	switch {
	case rep.ID != req.ID:
		return fmt.Errorf("%w: reply to request %d, asked %d", ErrMalformed, rep.ID, req.ID)
	case rep.Key != req.Key:
		return fmt.Errorf("%w: reply for key %q, asked %q", ErrMalformed, rep.Key, req.Key)
	case rep.Remaining < 0 || rep.Remaining > capacity:
		return fmt.Errorf("%w: remaining %d not in 0…%d", ErrMalformed, rep.Remaining, capacity)
	case rep.Reset < 0 || rep.Reset > longest:
		return fmt.Errorf("%w: reset %dns not in 0…%dns", ErrMalformed, rep.Reset, longest)
	case rep.Retry < 0:
		return fmt.Errorf("%w: retry %dns negative", ErrMalformed, rep.Retry)
	case rep.Allowed && rep.Retry != 0:
		return fmt.Errorf("%w: an admission with retry %dns", ErrMalformed, rep.Retry)
	case rep.Allowed && rep.Hits(req) > capacity:
		return fmt.Errorf("%w: admitted %d hits, more than the limit %d", ErrMalformed, req.Hits, capacity)
	}
	return nil
}

// Hits is the number of hits rep admitted of req: req.Hits when allowed.
func (rep *Reply) Hits(req *Request) int64 {
	if rep.Allowed {
		return req.Hits
	}
	return 0
}

// decoder reads a message; its first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: bad %s", ErrMalformed, what)
	}
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.b) == 0 {
		d.fail("length")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > MaxKeyBytes || n > uint64(len(d.b)) {
		d.fail("key length")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	return d.err
}

package limit

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
)

// A concurrency limit (Stripe's concurrent-requests limiter) caps the
// requests of a key in flight at once, not the requests per window. Each
// admitted request holds a slot as a lease: a random 128-bit id in the key's
// slot set, with an expiry. The request's end frees it (release), and a lost
// release is harmless: the lease expires after its TTL and the slot comes
// back. Stores keep the slot sets (store.Leases in memory, Redis sorted sets
// scored by expiry); this file holds what they share — the slot key, the
// decision, and the lease token the caller holds.

// SlotKey names the slot set of one concurrency limit for one descriptor: the
// first 128 bits of SHA-256 of the limit's store key (rules.Limit.AppendKey).
// A fixed-size name keeps lease tokens short whatever the descriptor's size,
// and lets a token name its sets without the server keeping anything but the
// sets themselves.
type SlotKey [16]byte

// SlotKeyOf returns the slot key of a limit's store key.
func SlotKeyOf(key []byte) SlotKey {
	sum := sha256.Sum256(key)
	var k SlotKey
	copy(k[:], sum[:16])
	return k
}

// String is the key in hex, as Redis key names and logs carry it.
func (k SlotKey) String() string { return hex.EncodeToString(k[:]) }

// LeaseID is a lease's random 128-bit id: the member it holds in every slot
// set it took a slot of. Guessing one is as hard as guessing 128 random bits.
type LeaseID [16]byte

// String is the id in hex, the member name in a Redis sorted set.
func (id LeaseID) String() string { return hex.EncodeToString(id[:]) }

// SlotItem is one concurrency limit a request matched, as a store sees it.
type SlotItem struct {
	Key SlotKey
	// Max is the most leases the set may hold at once; 0 admits none.
	Max int64
	// TTL is how long a lease lives unless released, in nanoseconds (> 0).
	TTL int64
}

// SlotDecision is one concurrency limit's answer for one request.
type SlotDecision struct {
	// Allowed reports whether a slot was free (and, when the request was
	// admitted, taken).
	Allowed bool
	// InFlight is how many live leases the set holds after the decision.
	InFlight int64
	// Remaining is how many more slots are free after the decision.
	Remaining int64
	// RetryAfter is, when denied, the time in nanoseconds until the oldest
	// live lease expires: when a slot comes back at the latest, should no
	// holder release earlier. 0 when allowed.
	RetryAfter int64
}

// DecideSlot is the decision for a set holding inFlight live leases (expired
// ones already dropped) of which the earliest expires at oldest, at now: a
// slot is free while inFlight < max. Stores call it (the Redis script
// transcribes it) so that they agree. taken says whether the request was
// admitted and the slot added; Remaining then counts it as held.
func DecideSlot(it SlotItem, inFlight, oldest, now int64, taken bool) SlotDecision {
	d := SlotDecision{Allowed: inFlight < it.Max, InFlight: inFlight}
	if !d.Allowed {
		d.RetryAfter = max(oldest-now, 1)
		return d
	}
	if taken {
		d.InFlight++
	}
	d.Remaining = max(it.Max-d.InFlight, 0)
	return d
}

// Release outcomes of one lease in one slot set.
type ReleaseState uint8

const (
	// Unknown: the set holds no such lease — never issued, already
	// released, or expired and dropped since.
	Unknown ReleaseState = iota
	// Released: the lease was live and its slot is free now.
	Released
	// Expired: the lease had outlived its TTL (its slot was already free to
	// others); it is gone now.
	Expired
)

var releaseNames = [...]string{"unknown", "released", "expired"}

func (s ReleaseState) String() string {
	if int(s) < len(releaseNames) {
		return releaseNames[s]
	}
	return fmt.Sprintf("ReleaseState(%d)", s)
}

// Join combines the outcomes of one lease in two sets: released beats
// expired beats unknown.
func (s ReleaseState) Join(o ReleaseState) ReleaseState {
	if s == Released || o == Released {
		return Released
	}
	return max(s, o)
}

// Lease is what a request holds while it is in flight: its id and the slot
// sets it took a slot of. Its token (String) is all a release needs.
type Lease struct {
	ID   LeaseID
	Keys []SlotKey
}

// MaxLeaseKeys bounds the slot sets of one lease (a request's concurrency
// limits).
const MaxLeaseKeys = 64

// leaseVersion is the first byte of a token; a new layout gets a new one.
const leaseVersion = 1

// ErrBadLease is returned (wrapped, with the reason) for a token that
// ParseLease cannot read.
var ErrBadLease = errors.New("malformed lease id")

// String is the lease's token: URL-safe base64 without padding of a version
// byte, the 16-byte id and the 16-byte slot keys. It is opaque to clients.
func (l Lease) String() string {
	var buf [1 + 16 + 16*4]byte // on the stack for up to 4 keys
	b := append(buf[:0], leaseVersion)
	b = append(b, l.ID[:]...)
	for _, k := range l.Keys {
		b = append(b, k[:]...)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// ParseLease reads a token made by Lease.String. Its errors wrap ErrBadLease.
func ParseLease(token string) (Lease, error) {
	if len(token) > base64.RawURLEncoding.EncodedLen(1+16+16*MaxLeaseKeys) {
		return Lease{}, fmt.Errorf("%w: %d characters is too long", ErrBadLease, len(token))
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(token) // one token per lease
	switch {
	case err != nil:
		return Lease{}, fmt.Errorf("%w: not URL-safe base64", ErrBadLease)
	case len(b) < 1+16+16 || (len(b)-17)%16 != 0:
		return Lease{}, fmt.Errorf("%w: %d bytes is not a lease", ErrBadLease, len(b))
	case b[0] != leaseVersion:
		return Lease{}, fmt.Errorf("%w: unknown version %d", ErrBadLease, b[0])
	}
	var l Lease
	copy(l.ID[:], b[1:17])
	for p := 17; p < len(b); p += 16 {
		var k SlotKey
		copy(k[:], b[p:p+16])
		l.Keys = append(l.Keys, k)
	}
	return l, nil
}

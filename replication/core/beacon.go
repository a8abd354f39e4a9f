package core

import (
	"encoding/binary"
	"errors"
)

// A beacon's bytes on the wire: its number as a uvarint, then, from the
// version that agrees on clocks (clock.go), its raw send time (unix ns) as a
// varint and its echoes: their number as a uvarint, then per echo the PoP's
// name (uvarint length, bytes) and its send and receive times as varints of
// microseconds before the beacon's send time — a few bytes each where unix
// ns take nine, and a beacon carries one echo per PoP heard. A reader that
// knows only the number reads the first uvarint and ignores the rest; this
// one reads a bare number as a beacon without timestamps.

// Bounds a received beacon must keep: names no longer than a subject token
// sensibly is, no more echoes than PoPs any topology has.
const (
	maxBeaconName   = 255
	maxBeaconEchoes = 4096
	// maxBeaconAge bounds an echo's times before the beacon, in µs (about
	// 100 days), so that converting them to ns cannot overflow.
	maxBeaconAge = 1 << 43
)

// ErrBeacon is returned for a beacon whose bytes do not parse.
var ErrBeacon = errors.New("malformed presence beacon")

// AppendBeacon appends the wire form of the Hello m to b. Echo times keep
// their microseconds.
func AppendBeacon(b []byte, m Message) []byte {
	b = binary.AppendUvarint(b, m.Seq)
	if m.Sent == 0 && len(m.Echo) == 0 {
		return b
	}
	b = binary.AppendVarint(b, m.Sent)
	b = binary.AppendUvarint(b, uint64(len(m.Echo)))
	for _, e := range m.Echo {
		b = binary.AppendUvarint(b, uint64(len(e.POP)))
		b = append(b, e.POP...)
		b = binary.AppendVarint(b, (m.Sent-e.Sent)/1000)
		b = binary.AppendVarint(b, (m.Sent-e.Recv)/1000)
	}
	return b
}

// ParseBeacon reads a beacon's number, send time and echoes. When only the
// part after the number is malformed it returns the number, no timestamps
// and ErrBeacon: the beacon still says its sender is there, but nothing it
// claims about clocks is taken. ok is false when not even the number parses.
func ParseBeacon(data []byte) (seq uint64, sent int64, echo []Echo, ok bool, err error) {
	seq, n := binary.Uvarint(data)
	if n <= 0 {
		return 0, 0, nil, false, ErrBeacon
	}
	rest := data[n:]
	if len(rest) == 0 {
		return seq, 0, nil, true, nil
	}
	sent, echo, err = parseBeaconClock(rest)
	if err != nil {
		return seq, 0, nil, true, err
	}
	return seq, sent, echo, true, nil
}

func parseBeaconClock(b []byte) (int64, []Echo, error) {
	varint := func() (int64, bool) {
		v, n := binary.Varint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	before := func(sent int64) (int64, bool) {
		v, ok := varint()
		if !ok || v > maxBeaconAge || v < -maxBeaconAge {
			return 0, false
		}
		return sent - v*1000, true
	}
	uvarint := func(limit uint64) (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 || v > limit {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	sent, ok := varint()
	if !ok {
		return 0, nil, ErrBeacon
	}
	k, ok := uvarint(maxBeaconEchoes)
	if !ok {
		return 0, nil, ErrBeacon
	}
	echo := make([]Echo, 0, min(k, uint64(len(b)/3)))
	for range k {
		l, ok := uvarint(maxBeaconName)
		if !ok || uint64(len(b)) < l {
			return 0, nil, ErrBeacon
		}
		e := Echo{POP: string(b[:l])}
		b = b[l:]
		if e.Sent, ok = before(sent); !ok {
			return 0, nil, ErrBeacon
		}
		if e.Recv, ok = before(sent); !ok {
			return 0, nil, ErrBeacon
		}
		echo = append(echo, e)
	}
	if len(b) != 0 {
		return 0, nil, ErrBeacon
	}
	return sent, echo, nil
}

package limit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// stateFormat is the first byte of an encoded State: its format version.
const stateFormat = 1

// ErrBadState is returned by DecodeState for bytes AppendState did not write.
var ErrBadState = errors.New("limit: bad encoded state")

// AppendState appends st, every algorithm's fields, to dst in a compact
// binary form that DecodeState reads back: the counts and times as varints,
// the bucket fill as a float64, and SlidingLog's hit times (oldest first) as
// varint deltas. Unheard is not written: it is a guess made at a decision's
// instant, never state. A SlidingLog state costs about two bytes a hit.
func AppendState(dst []byte, st *State) []byte {
	dst = append(dst, stateFormat)
	dst = binary.AppendVarint(dst, st.Start)
	dst = binary.AppendVarint(dst, st.Cur)
	dst = binary.AppendVarint(dst, st.Prev)
	dst = binary.LittleEndian.AppendUint64(dst, math.Float64bits(st.Tokens))
	n := int64(0)
	if st.Log != nil {
		n = st.Log.n
	}
	dst = binary.AppendUvarint(dst, uint64(n))
	prev := int64(0)
	for i := int64(0); i < n; i++ {
		t := st.Log.at(i)
		dst = binary.AppendVarint(dst, t-prev)
		prev = t
	}
	return dst
}

// maxDecodedLog bounds the hit times DecodeState accepts: a log holds at most
// a limit's worth, and a limit is at most MaxLogLimit.
const maxDecodedLog = MaxLogLimit

// DecodeState reads a State that AppendState wrote. It fails with ErrBadState,
// naming what is wrong, for anything else: a truncated or overlong value, an
// unknown format, negative counts, a fill that is not a finite number, a log
// longer than MaxLogLimit or whose times go backwards.
func DecodeState(b []byte) (State, error) {
	var st State
	if len(b) == 0 || b[0] != stateFormat {
		return st, fmt.Errorf("%w: format byte %x, want %d", ErrBadState, b[:min(len(b), 1)], stateFormat)
	}
	b = b[1:]
	varint := func(what string) (int64, error) {
		v, k := binary.Varint(b)
		if k <= 0 {
			return 0, fmt.Errorf("%w: %s is not a varint", ErrBadState, what)
		}
		b = b[k:]
		return v, nil
	}
	var err error
	if st.Start, err = varint("start"); err != nil {
		return State{}, err
	}
	if st.Cur, err = varint("cur"); err != nil {
		return State{}, err
	}
	if st.Prev, err = varint("prev"); err != nil {
		return State{}, err
	}
	if st.Cur < 0 || st.Prev < 0 {
		return State{}, fmt.Errorf("%w: negative count cur=%d prev=%d", ErrBadState, st.Cur, st.Prev)
	}
	if len(b) < 8 {
		return State{}, fmt.Errorf("%w: tokens truncated", ErrBadState)
	}
	st.Tokens = math.Float64frombits(binary.LittleEndian.Uint64(b))
	b = b[8:]
	if math.IsNaN(st.Tokens) || math.IsInf(st.Tokens, 0) || st.Tokens < 0 {
		return State{}, fmt.Errorf("%w: tokens %v", ErrBadState, st.Tokens)
	}
	n, k := binary.Uvarint(b)
	if k <= 0 || n > maxDecodedLog {
		return State{}, fmt.Errorf("%w: log length", ErrBadState)
	}
	b = b[k:]
	if n > 0 {
		st.Log = newRing(int64(n))
		prev := int64(0)
		for i := uint64(0); i < n; i++ {
			d, err := varint("log time")
			if err != nil {
				return State{}, err
			}
			if i > 0 && d < 0 {
				return State{}, fmt.Errorf("%w: log times go backwards", ErrBadState)
			}
			prev += d
			st.Log.push(prev, 1, int64(n))
		}
	}
	if len(b) != 0 {
		return State{}, fmt.Errorf("%w: %d trailing bytes", ErrBadState, len(b))
	}
	return st, nil
}

package limit

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

// A state written by AppendState and read back by DecodeState decides every
// later request exactly as the original does, for every algorithm: what a
// restart restores is the state, not an approximation of it.
func TestStateRoundTripDecidesAlike(t *testing.T) {
	r := rng(t)
	windows := []int64{int64(time.Second), int64(time.Minute), int64(time.Hour)}
	for trial := range 2000 {
		spec := Spec{Algorithm: Algorithm(r.IntN(int(SlidingLog) + 1)), Limit: 1 + r.Int64N(60), Window: windows[r.IntN(len(windows))]}
		if spec.Algorithm == TokenBucket || spec.Algorithm == GCRA {
			spec.Burst = r.Int64N(2 * spec.Limit)
		}
		var st State
		now := int64(1706000040e9) + r.Int64N(spec.Window)
		for range r.IntN(40) {
			now += r.Int64N(spec.Window / 8)
			spec.Take(&st, now, 1+r.Int64N(3))
		}
		enc := AppendState(nil, &st)
		got, err := DecodeState(enc)
		if err != nil {
			t.Fatalf("trial %d %+v: decode: %v", trial, spec, err)
		}
		if again := AppendState(nil, &got); !bytes.Equal(again, enc) {
			t.Fatalf("trial %d %+v: re-encoding differs:\n%x\n%x", trial, spec, enc, again)
		}
		orig := cloneState(st)
		for step := range 30 {
			now += r.Int64N(spec.Window / 8)
			hits := 1 + r.Int64N(3)
			if a, b := spec.Take(&orig, now, hits), spec.Take(&got, now, hits); a != b {
				t.Fatalf("trial %d step %d %+v: original decides %+v, decoded %+v", trial, step, spec, a, b)
			}
		}
	}
}

func TestDecodeStateRejects(t *testing.T) {
	good := AppendState(nil, &State{Start: 5, Cur: 3, Prev: 2, Tokens: 1.5})
	tests := map[string][]byte{
		"empty":          nil,
		"unknown format": append([]byte{9}, good[1:]...),
		"truncated":      good[:len(good)-2],
		"trailing bytes": append(append([]byte(nil), good...), 0),
		"negative count": AppendState(nil, &State{Cur: -1}),
		"log too long":   append(AppendState(nil, &State{})[:len(AppendState(nil, &State{}))-1], 0xe9, 0x07), // 1001
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeState(b); !errors.Is(err, ErrBadState) {
				t.Fatalf("DecodeState(%x) = %v, want ErrBadState", b, err)
			}
		})
	}
}

// Any bytes decode to an error or to a state whose encoding decodes to the
// same state (a value may be spelled in more than one way, an overlong varint,
// so the bytes need not match); none panics.
func FuzzDecodeState(f *testing.F) {
	f.Add(AppendState(nil, &State{Start: 1706000040e9, Cur: 7, Prev: 3}))
	f.Add(AppendState(nil, &State{Start: 1706000040e9, Tokens: 2.5}))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := DecodeState(b)
		if err != nil {
			return
		}
		enc := AppendState(nil, &st)
		again, err := DecodeState(enc)
		if err != nil {
			t.Fatalf("%x decoded to %+v, whose encoding %x does not decode: %v", b, st, enc, err)
		}
		if reenc := AppendState(nil, &again); !bytes.Equal(reenc, enc) {
			t.Fatalf("%x decoded to %+v, which does not round-trip: %x then %x", b, st, enc, reenc)
		}
	})
}

package escrow

import (
	"errors"
	"fmt"
)

// MaxLimit is the largest Spec.Limit a Ledger takes. It keeps every product
// the decision computes (a count times Scale·2¹⁶, a limit times 2¹⁶) within
// 128 bits with room to spare.
const MaxLimit = 1 << 40

// DefaultScale is the Scale a Config gets when it names none: allowances are
// held in units of 2⁻²⁰ of the limit.
const DefaultScale = 1 << 20

// MaxScale is the largest Scale a Config may name; it keeps Scale·2¹⁶ and a
// count times it within the 128-bit products the decision computes.
const MaxScale = 1 << 32

// ErrBadSpec is wrapped by the errors Spec.Validate returns.
var ErrBadSpec = errors.New("escrow: bad spec")

// Spec is how one limit counts: Limit hits per Window, by the fixed window,
// or by the sliding window estimate prev·(1−elapsed/Window) + cur when
// Sliding is set. The same key is always checked with the same Spec.
type Spec struct {
	Limit   int64 // hits per window, 1…MaxLimit
	Window  int64 // window length in nanoseconds, > 0; windows are epoch-aligned
	Sliding bool  // the sliding window estimate rather than the fixed window
}

// Validate reports whether s can be decided on: a Limit in 1…MaxLimit and
// a positive Window.
func (s Spec) Validate() error {
	switch {
	case s.Limit <= 0 || s.Limit > MaxLimit:
		return fmt.Errorf("%w: limit %d not in 1…%d", ErrBadSpec, s.Limit, int64(MaxLimit))
	case s.Window <= 0:
		return fmt.Errorf("%w: window %dns not positive", ErrBadSpec, s.Window)
	}
	return nil
}

package quota

import (
	"fmt"
	"time"

	"github.com/edgelimit/edgelimit/pop/rules"
)

// Wire is a quota as JSON carries it: in the admin API, the audit trail and
// the snapshot file.
type Wire struct {
	APIKey      string         `json:"api_key,omitempty"`
	Tier        string         `json:"tier"`
	Overrides   []WireOverride `json:"overrides"`
	EffectiveAt *time.Time     `json:"effective_at"`
	ExpiresAt   *time.Time     `json:"expires_at"`
	UpdatedAt   *time.Time     `json:"updated_at,omitempty"`
}

// WireOverride is an Override as JSON carries it; Unit is second, minute,
// hour or day.
type WireOverride struct {
	Descriptor      string `json:"descriptor"`
	RequestsPerUnit int64  `json:"requests_per_unit"`
	Unit            string `json:"unit"`
}

// ToWire returns q as JSON carries it; nil for nil.
func (q *Quota) ToWire() *Wire {
	if q == nil {
		return nil
	}
	w := &Wire{APIKey: q.APIKey, Tier: q.Tier, Overrides: make([]WireOverride, len(q.Overrides))}
	for i, o := range q.Overrides {
		w.Overrides[i] = WireOverride{o.Descriptor, o.RequestsPerUnit, o.Unit.String()}
	}
	w.EffectiveAt = timePtr(q.EffectiveAt.Time())
	w.ExpiresAt = timePtr(q.ExpiresAt.Time())
	w.UpdatedAt = timePtr(q.UpdatedAt.Time())
	return w
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	t = t.UTC()
	return &t
}

// FromWire returns the quota w describes, validated, with key as its API key
// when w names none. A bad field is a *FieldError.
func FromWire(key string, w *Wire) (*Quota, error) {
	if w.APIKey != "" && key != "" && w.APIKey != key {
		return nil, &FieldError{"api_key", fmt.Sprintf("the body names %q, the path %q", w.APIKey, key)}
	}
	if key == "" {
		key = w.APIKey
	}
	q := &Quota{APIKey: key, Tier: w.Tier, Overrides: make([]Override, len(w.Overrides))}
	for i, o := range w.Overrides {
		u, err := rules.ParseUnit(o.Unit)
		if err != nil {
			return nil, &FieldError{fmt.Sprintf("overrides[%d].unit", i), err.Error()}
		}
		q.Overrides[i] = Override{Descriptor: o.Descriptor, RequestsPerUnit: o.RequestsPerUnit, Unit: u}
	}
	if w.EffectiveAt != nil {
		q.EffectiveAt = TimeOf(*w.EffectiveAt)
	}
	if w.ExpiresAt != nil {
		q.ExpiresAt = TimeOf(*w.ExpiresAt)
	}
	if w.UpdatedAt != nil {
		q.UpdatedAt = TimeOf(*w.UpdatedAt)
	}
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return q.Prepare(), nil
}

package strong

import (
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
)

// ErrNoCandidates is returned by Pick when there is no name to pick from.
var ErrNoCandidates = errors.New("strong: no candidates")

// Pick returns the name among names, which must be sorted and free of
// duplicates, that is home to key: the FNV-1a hash of key modulo the number
// of names. Every PoP that knows the same names picks the same one.
func Pick(key string, names []string) (string, error) {
	if len(names) == 0 {
		return "", ErrNoCandidates
	}
	if !slices.IsSorted(names) {
		return "", fmt.Errorf("strong: candidates %q are not sorted", names)
	}
	for i := 1; i < len(names); i++ {
		if names[i] == names[i-1] {
			return "", fmt.Errorf("strong: candidate %q named twice", names[i])
		}
	}
	h := fnv.New64a()
	h.Write([]byte(key))
	return names[h.Sum64()%uint64(len(names))], nil
}

// Home is where a key's checks are decided: a region and the PoP of it
// that decides.
type Home struct {
	Region, PoP string
}

// HomeOf returns key's home among regions (region name → its PoPs; the
// slices need not be sorted): Pick over the sorted region names, then Pick
// over that region's sorted PoPs. A configured region (non-empty) replaces
// the first pick; it must be one of regions.
func HomeOf(key string, regions map[string][]string, configured string) (Home, error) {
	names := make([]string, 0, len(regions))
	for r := range regions {
		names = append(names, r)
	}
	slices.Sort(names)
	reg := configured
	if reg == "" {
		var err error
		if reg, err = Pick(key, names); err != nil {
			return Home{}, fmt.Errorf("strong: home region of %q: %w", key, err)
		}
	} else if _, ok := regions[reg]; !ok {
		return Home{}, fmt.Errorf("strong: configured home region %q is not one of %q", reg, names)
	}
	pops := slices.Clone(regions[reg])
	slices.Sort(pops)
	pops = slices.Compact(pops)
	p, err := Pick(key, pops)
	if err != nil {
		return Home{}, fmt.Errorf("strong: home PoP of %q in region %q: %w", key, reg, err)
	}
	return Home{Region: reg, PoP: p}, nil
}

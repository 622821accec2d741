package event

// This file matches a shape's paths against the fields of a document: each
// fields, exclusion and redact path is a pattern whose match state is a bit
// set, and judge turns the states of all patterns at one path into what the
// shape does with the value there.

// A pattern's match state is a bit set of positions in the pattern: bit i
// means segments [0, i) are matched; bit len means the whole pattern is
// matched, which is sticky (everything below a matched path is matched).

func (p pattern) closure(b uint64) uint64 {
	for i, seg := range p {
		if b&(1<<uint(i)) != 0 && seg == "**" {
			b |= 1 << uint(i+1)
		}
	}
	return b
}

func (p pattern) start() uint64 { return p.closure(1) }

func (p pattern) step(b uint64, seg string) uint64 {
	end := uint64(1) << uint(len(p))
	n := b & end
	for i, ps := range p {
		if b&(1<<uint(i)) == 0 {
			continue
		}
		switch ps {
		case "**":
			n |= 1 << uint(i)
		case seg:
			n |= 1 << uint(i+1)
		}
	}
	return p.closure(n)
}

func (p pattern) matched(b uint64) bool { return b&(1<<uint(len(p))) != 0 }

// state is the match state of every pattern of a shape at one path.
type state []uint64

func (s *Shape) root() state {
	st := make(state, len(s.pats))
	for i, p := range s.pats {
		st[i] = p.start()
	}
	return st
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// verdict is what the shape does with the value at one path.
type verdict uint8

const (
	vKeep    verdict = iota // copy the value as is
	vDrop                   // leave the field out
	vRedact                 // replace the value (redactWith)
	vDescend                // shape the value's fields; scalars are kept
	vPartial                // shape the value's fields; scalars are dropped (inclusion not reached yet)
)

func (s *Shape) judge(st state) (verdict, *redaction) {
	for _, i := range s.exc {
		if s.pats[i].matched(st[i]) {
			return vDrop, nil
		}
	}
	allIncluded := true
	for _, set := range s.incSets {
		included, live := false, false
		for _, i := range set {
			if s.pats[i].matched(st[i]) {
				included = true
				break
			}
			if st[i] != 0 {
				live = true
			}
		}
		if !included {
			if !live {
				return vDrop, nil
			}
			allIncluded = false
		}
	}
	var hashed *redaction
	for k := range s.red {
		r := &s.red[k]
		if s.pats[r.pat].matched(st[r.pat]) {
			if !r.hash {
				return vRedact, r // a mask wins over a hash
			}
			if hashed == nil {
				hashed = r
			}
		}
	}
	if hashed != nil {
		return vRedact, hashed
	}
	if !allIncluded {
		return vPartial, nil
	}
	for _, i := range s.exc {
		if st[i] != 0 {
			return vDescend, nil
		}
	}
	for _, r := range s.red {
		if st[r.pat] != 0 {
			return vDescend, nil
		}
	}
	return vKeep, nil
}

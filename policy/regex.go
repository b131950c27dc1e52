package policy

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"unicode"

	"github.com/inmesh/inmesh/internal/recache"
)

// wholeRegex matches a value as Linkerd's proxy does: the leftmost-first
// match of the pattern (the match a backtracking engine prefers) must start
// at 0 and end at the end of the value. That is stricter than anchoring the
// pattern at both ends: "a|ab" does not match "ab", because the preferred
// match of "a|ab" there is "a".
//
// Checking it without allocating: the value matches only if the pattern
// anchored at both ends does (full, a boolean test). For most patterns the
// two are the same, and the compiler proves it (exact false); for the
// others the preferred match from 0 is computed on a match, which allocates
// its index pair.
type wholeRegex struct {
	full   *regexp.Regexp // ^(?:re)$
	prefix *regexp.Regexp // ^(?:re), for the preferred end
	exact  bool           // full matching implies the preferred match ends at the end
}

// wholeRegexes keeps the compiled form of every pattern: a policy update
// mostly repeats the patterns of the one before.
var wholeRegexes recache.Memo[wholeRegex]

// CheckRegex returns the error that [Compile] gives pattern as the
// regular expression of a path, header or query-parameter match under the
// default [Options] (too long, or not a regular expression), or nil: what
// a control plane checks before it serves a route. The error names no
// field.
func CheckRegex(pattern string) error {
	if len(pattern) > MaxRegexLen {
		return fmt.Errorf("regex of %d bytes is longer than the limit of %d", len(pattern), MaxRegexLen)
	}
	_, err := compileWholeRegex(pattern)
	return err
}

func compileWholeRegex(pattern string) (wholeRegex, error) {
	return wholeRegexes.Get(pattern, newWholeRegex)
}

// newWholeRegex compiles pattern; wholeRegexes keeps the result, so its
// regexes are compiled here directly rather than kept twice.
func newWholeRegex(pattern string) (wholeRegex, error) {
	// Compiling the pattern alone first reports a bad one by what the user
	// wrote, not by the anchored form, and rejects patterns that only parse
	// inside the group (an unbalanced ")(").
	if _, err := regexp.Compile(pattern); err != nil {
		return wholeRegex{}, err
	}
	full, err := regexp.Compile(`^(?:` + pattern + `)$`)
	if err != nil {
		return wholeRegex{}, err
	}
	prefix := regexp.MustCompile(`^(?:` + pattern + `)`)
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return wholeRegex{}, err
	}
	return wholeRegex{full: full, prefix: prefix, exact: unambiguousEnd(re)}, nil
}

func (w *wholeRegex) matchString(s string) bool {
	if !w.full.MatchString(s) {
		return false
	}
	if w.exact {
		return true
	}
	loc := w.prefix.FindStringIndex(s)
	return loc != nil && loc[1] == len(s)
}

func (w *wholeRegex) matchBytes(b []byte) bool {
	if !w.full.Match(b) {
		return false
	}
	if w.exact {
		return true
	}
	loc := w.prefix.FindIndex(b)
	return loc != nil && loc[1] == len(b)
}

func (w *wholeRegex) String() string {
	s := w.full.String()
	return s[len(`^(?:`) : len(s)-len(`)$`)]
}

// unambiguousEnd reports whether every match of re from a given start
// position is the only one, or the longest: then a value matched whole by
// some match is matched whole by the preferred one. It holds for a
// sequence of single-character items (literals, classes, any character),
// zero-width assertions, and greedy repetitions of one character class
// that are either last or followed by a character outside the class, so
// that each repetition's length is forced. Anything else (alternation,
// optional or lazy parts, nested repetition) is reported as ambiguous.
func unambiguousEnd(re *syntax.Regexp) bool {
	items := flatten(re, nil)
	if items == nil {
		return false
	}
	for i, it := range items {
		switch it.Op {
		case syntax.OpStar, syntax.OpPlus, syntax.OpRepeat:
			if it.Flags&syntax.NonGreedy != 0 || !singleChar(it.Sub[0]) {
				return false
			}
			next := nextConsuming(items[i+1:])
			if next != nil && overlaps(it.Sub[0], next) {
				return false
			}
		case syntax.OpQuest:
			// x? is forced only at the very end.
			if it.Flags&syntax.NonGreedy != 0 || !singleChar(it.Sub[0]) || nextConsuming(items[i+1:]) != nil {
				return false
			}
		}
	}
	return true
}

// flatten returns re as a sequence of items, looking through captures and
// concatenations; nil when an item is neither a single character, a
// zero-width assertion nor a repetition.
func flatten(re *syntax.Regexp, out []*syntax.Regexp) []*syntax.Regexp {
	switch re.Op {
	case syntax.OpCapture:
		return flatten(re.Sub[0], out)
	case syntax.OpConcat:
		for _, s := range re.Sub {
			if out = flatten(s, out); out == nil {
				return nil
			}
		}
		return out
	case syntax.OpLiteral:
		// A literal string is a sequence of single characters.
		for _, r := range re.Rune {
			out = append(out, &syntax.Regexp{Op: syntax.OpLiteral, Flags: re.Flags, Rune: []rune{r}})
		}
		if out == nil {
			out = []*syntax.Regexp{}
		}
		return out
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL,
		syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText,
		syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary,
		syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		return append(out, re)
	}
	return nil
}

func zeroWidth(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText,
		syntax.OpEndText, syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return true
	}
	return false
}

// nextConsuming returns the first item that consumes input, nil if none.
func nextConsuming(items []*syntax.Regexp) *syntax.Regexp {
	for _, it := range items {
		if !zeroWidth(it) {
			return it
		}
	}
	return nil
}

func singleChar(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpLiteral:
		return len(re.Rune) == 1
	case syntax.OpCharClass, syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return true
	}
	return false
}

// overlaps reports whether the characters class may match can start next;
// it errs towards true.
func overlaps(class, next *syntax.Regexp) bool {
	if !singleChar(next) {
		return true
	}
	a, b := charRanges(class), charRanges(next)
	for i := 0; i+1 < len(a); i += 2 {
		for j := 0; j+1 < len(b); j += 2 {
			if a[i] <= b[j+1] && b[j] <= a[i+1] {
				return true
			}
		}
	}
	return false
}

// charRanges returns the characters a single-character item matches as
// lo, hi pairs.
func charRanges(re *syntax.Regexp) []rune {
	switch re.Op {
	case syntax.OpLiteral:
		r := re.Rune[0]
		out := []rune{r, r}
		if re.Flags&syntax.FoldCase != 0 {
			for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
				out = append(out, f, f)
			}
		}
		return out
	case syntax.OpCharClass:
		return re.Rune
	case syntax.OpAnyCharNotNL:
		return []rune{0, '\n' - 1, '\n' + 1, unicode.MaxRune}
	}
	return []rune{0, unicode.MaxRune}
}

package profiles

import (
	"regexp/syntax"
	"strings"
)

// fastPath recognises the path patterns that profiles use most, so that
// they match without running the regexp engine:
//
//	/pkg.Service/Method   a literal (what `linkerd profile --proto` writes)
//	/books/[^/]+          a literal and one non-empty segment
//	/api/.*               a literal and anything without a newline
//
// It returns nil for every other pattern.
func fastPath(pattern string) func(string) bool {
	re, err := syntax.Parse(strings.TrimSpace(pattern), syntax.Perl)
	if err != nil {
		return nil
	}
	re = re.Simplify()
	subs := []*syntax.Regexp{re}
	if re.Op == syntax.OpConcat {
		subs = re.Sub
	}
	// Leading and trailing anchors change nothing: the match is whole.
	for len(subs) > 0 && subs[0].Op == syntax.OpBeginText {
		subs = subs[1:]
	}
	for len(subs) > 0 && subs[len(subs)-1].Op == syntax.OpEndText {
		subs = subs[:len(subs)-1]
	}
	literal := func(r *syntax.Regexp) (string, bool) {
		if r.Op != syntax.OpLiteral || r.Flags&syntax.FoldCase != 0 {
			return "", false
		}
		return string(r.Rune), true
	}
	switch len(subs) {
	case 1:
		if lit, ok := literal(subs[0]); ok {
			return func(p string) bool { return p == lit }
		}
	case 2:
		lit, ok := literal(subs[0])
		if !ok {
			return nil
		}
		tail := subs[1]
		switch {
		case tail.Op == syntax.OpPlus && isNotSlash(tail.Sub[0]):
			return func(p string) bool {
				rest, ok := strings.CutPrefix(p, lit)
				return ok && rest != "" && !strings.Contains(rest, "/")
			}
		case tail.Op == syntax.OpStar && tail.Sub[0].Op == syntax.OpAnyCharNotNL:
			return func(p string) bool {
				rest, ok := strings.CutPrefix(p, lit)
				return ok && !strings.Contains(rest, "\n")
			}
		}
	}
	return nil
}

// isNotSlash reports whether r is the class [^/] (every rune but '/').
func isNotSlash(r *syntax.Regexp) bool {
	return r.Op == syntax.OpCharClass && len(r.Rune) == 4 &&
		r.Rune[0] == 0 && r.Rune[1] == '/'-1 && r.Rune[2] == '/'+1 && r.Rune[3] == 0x10ffff
}

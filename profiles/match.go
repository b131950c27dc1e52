package profiles

// RequestMatch is a condition on a request. It is one of [MatchAll],
// [MatchAny], [MatchNot], [PathRegex] and [Method].
type RequestMatch interface{ isRequestMatch() }

// MatchAll matches when every one of its conditions matches; an empty
// MatchAll matches every request.
type MatchAll []RequestMatch

// MatchAny matches when at least one of its conditions matches; an empty
// MatchAny matches no request.
type MatchAny []RequestMatch

// MatchNot matches when its condition does not.
type MatchNot struct{ Match RequestMatch }

// PathRegex matches when the regular expression (Go RE2 syntax) matches
// the whole request path, without the query. As in Linkerd, surrounding
// space is trimmed and the pattern is anchored with ^ and $ unless it
// already starts or ends with them, without a group: "/api" does not
// match "/api/v1", write "/api/.*"; "/a|/b" is "^/a|/b$", which matches
// any path that starts with /a or ends with /b, write "(/a|/b)" for
// either whole path.
type PathRegex string

// Method matches requests with exactly this method.
type Method string

func (MatchAll) isRequestMatch()  {}
func (MatchAny) isRequestMatch()  {}
func (MatchNot) isRequestMatch()  {}
func (PathRegex) isRequestMatch() {}
func (Method) isRequestMatch()    {}

// ResponseMatch is a condition on a response. It is one of [ResponseAll],
// [ResponseAny], [ResponseNot] and [StatusRange].
type ResponseMatch interface{ isResponseMatch() }

// ResponseAll matches when every one of its conditions matches.
type ResponseAll []ResponseMatch

// ResponseAny matches when at least one of its conditions matches.
type ResponseAny []ResponseMatch

// ResponseNot matches when its condition does not.
type ResponseNot struct{ Match ResponseMatch }

// StatusRange matches status codes from Min to Max, both included. A zero
// bound means the range is the single other value (Linkerd's proxy instead
// drops such a class). Both zero, or a bound outside 100-999, does not
// compile; Min above Max matches nothing, as in Linkerd's proxy.
type StatusRange struct{ Min, Max uint32 }

func (ResponseAll) isResponseMatch() {}
func (ResponseAny) isResponseMatch() {}
func (ResponseNot) isResponseMatch() {}
func (StatusRange) isResponseMatch() {}

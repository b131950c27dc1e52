package manifest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTokens(t *testing.T) {
	tokens, err := ParseTokens([]byte(`
- token: abc
  serviceAccount: books
  namespace: default
- {token: def, serviceAccount: web, namespace: shop}
`))
	require.NoError(t, err)
	assert.Equal(t, []Token{{"abc", "books", "default"}, {"def", "web", "shop"}}, tokens)

	empty, err := ParseTokens([]byte("[]\n"))
	require.NoError(t, err)
	assert.Empty(t, empty)

	for doc, want := range map[string]string{
		"":         "empty",
		"# only\n": "empty",
		"- {serviceAccount: books, namespace: default}\n":                                                "[0].token: required",
		"- {token: a, namespace: default}\n":                                                             "[0].serviceAccount: required",
		"- {token: a, serviceAccount: books}\n":                                                          "[0].namespace: required",
		"- {token: a, serviceAccount: Books, namespace: default}\n":                                      "[0].serviceAccount: \"Books\" is not a DNS label",
		"- {token: a, serviceAccount: books, namespace: default, extra: 1}\n":                            "extra",
		"- {token: a, serviceAccount: b, namespace: c}\n- {token: a, serviceAccount: d, namespace: e}\n": "[1].token: the token is listed twice",
		"- {token: '', serviceAccount: b, namespace: c}\n":                                               "[0].token: required",
	} {
		_, err := ParseTokens([]byte(doc))
		assert.ErrorContains(t, err, want, "%q", doc)
	}
}

package yamltree

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestSplitDocuments(t *testing.T) {
	docs := SplitDocuments([]byte("a: 1\n---\nb: 2\n--- # c\n  ---\nc: 3\n---"))
	require.Len(t, docs, 4)
	assert.Equal(t, "a: 1\n", string(docs[0]))
	assert.Equal(t, "b: 2\n", string(docs[1]))
	assert.Equal(t, "  ---\nc: 3\n", string(docs[2]), "only a line that is exactly --- splits")
	assert.True(t, Blank(docs[3]))
	assert.True(t, Blank([]byte("# only\n\n  # comments\n")))
	assert.False(t, Blank([]byte("# c\nx: 1\n")))
}

func TestPaths(t *testing.T) {
	root, err := Decode([]byte("spec:\n  routes:\n  - {name: 3, extra: x}\n"))
	require.NoError(t, err)
	spec, err := root.Object("spec")
	require.NoError(t, err)
	inner, err := spec["spec"].Object("routes")
	require.NoError(t, err)
	routes, err := inner["routes"].List()
	require.NoError(t, err)
	_, err = routes[0].Object("name")
	assert.EqualError(t, err, "spec.routes[0].extra: unknown field (known: name)")
	fields, err := routes[0].Object("name", "extra")
	require.NoError(t, err)
	_, err = fields["name"].Str()
	assert.EqualError(t, err, "spec.routes[0].name: must be a string, not a number")
	s, err := fields["name"].Scalar()
	require.NoError(t, err)
	assert.Equal(t, "3", s)
	_, err = root.List()
	assert.EqualError(t, err, "must be a list, not an object")
	_, err = Decode([]byte("a: [1\n"))
	assert.ErrorContains(t, err, "bad YAML")
}

package policy_test

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/policy"
)

const fixtures = "../testdata/policy"

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, name))
	require.NoError(t, err)
	return b
}

func TestParseValid(t *testing.T) {
	doc, err := policy.Parse(readFixture(t, "valid.yaml"))
	require.NoError(t, err)
	require.Len(t, doc.Rules, 8)
	require.Equal(t, "orders", doc.Rules[0].ID)
	require.EqualValues(t, 3, doc.Rules[0].Version)
	require.Equal(t, policy.Limit{Window: policy.Duration(time.Second), Max: 5, Name: "burst"}, doc.Rules[0].Limits[0])
	require.Equal(t, policy.Limit{Window: policy.Duration(time.Minute), Max: 60, Fixed: true, Penalty: true}, doc.Rules[1].Limits[0])
	require.Equal(t, policy.Limit{Window: policy.Duration(time.Minute), Max: 1000, Algorithm: "token_bucket", Burst: 100}, doc.Rules[3].Limits[0])
	require.Equal(t, policy.Limit{Window: policy.Duration(time.Minute), Max: 5, Algorithm: "sliding_log"}, doc.Rules[4].Limits[0])
	require.True(t, doc.Rules[7].Shadow)
	require.Equal(t, 429, doc.Deny.Status)
	require.EqualValues(t, 5000, doc.Overrides["sk_vip_001"].Limits[0].Max)
	require.Equal(t, policy.Duration(15*time.Minute), doc.Escalation.DenyFor)

	s, err := policy.Load(readFixture(t, "valid.yaml"), 7, policy.Options{})
	require.NoError(t, err)
	require.EqualValues(t, 7, s.Version())
	require.Equal(t, 429, s.DenyStatus())
	require.True(t, s.HasShadow())
}

func TestParseJSON(t *testing.T) {
	doc, err := policy.Parse(readFixture(t, "valid.json"))
	require.NoError(t, err)
	require.Len(t, doc.Rules, 2)
	require.Equal(t, policy.Duration(time.Minute), doc.Default.Limits[0].Window)
	require.Equal(t, []string{"sk_internal_*"}, doc.Allow)
}

func TestParseEmpty(t *testing.T) {
	for _, in := range []string{"", "# nothing\n", "{}"} {
		doc, err := policy.Parse([]byte(in))
		require.NoError(t, err, "%q", in)
		require.NotNil(t, doc)
	}
}

// TestParseInvalid checks each fixture of testdata/policy/invalid fails with
// the error its first comment line (or .want file) announces, naming a line.
func TestParseInvalid(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(fixtures, "invalid", "*"))
	require.NoError(t, err)
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".want") {
			continue
		}
		n++
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			want := ""
			if w, err := os.ReadFile(f + ".want"); err == nil {
				want = strings.TrimSpace(string(w))
			} else {
				line, _ := bufio.NewReader(bytes.NewReader(data)).ReadString('\n')
				want = strings.TrimSpace(strings.TrimPrefix(line, "# want:"))
			}
			_, err = policy.Parse(data)
			require.Error(t, err)
			require.ErrorIs(t, err, policy.ErrInvalid)
			require.Contains(t, err.Error(), "policy: "+want)
			for _, e := range policy.Errors(err) {
				require.Positive(t, e.Line, "%v", e)
				require.NotEmpty(t, e.Field)
			}
		})
	}
	require.GreaterOrEqual(t, n, 15)
}

func TestParseSecondDocument(t *testing.T) {
	_, err := policy.Parse([]byte("allow: [a]\n---\nallow: [b]\n"))
	require.ErrorIs(t, err, policy.ErrInvalid)
	require.Contains(t, err.Error(), "line 2: document: more than one YAML document")
}

func TestParseManyErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for range 30 {
		b.WriteString("  - {id: x, match: {route: /a}, limits: [{window: 1m, max: 0}]}\n")
	}
	_, err := policy.Parse([]byte(b.String()))
	errs := policy.Errors(err)
	require.Len(t, errs, 20, "bounded")
	require.Equal(t, 2, errs[0].Line)
	require.Equal(t, 3, errs[1].Line)
}

func TestCompileGoDocument(t *testing.T) {
	doc := &policy.Document{Rules: []policy.Rule{{ID: "a", Match: policy.Match{Route: "/a"},
		Limits: []policy.Limit{{Window: policy.Duration(time.Minute), Max: 0}}}}}
	_, err := policy.Compile(doc, 1, policy.Options{})
	var pe *policy.Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "a", pe.Rule)
	require.Equal(t, "rules[0].limits[0].max", pe.Field)

	// Prepare's error fails the compile and names the entry.
	doc.Rules[0].Limits[0].Max = 5
	_, err = policy.Compile(doc, 1, policy.Options{Prepare: func(e *policy.Entry) (any, error) {
		return nil, ratelimit.ErrUnknownWindow
	}})
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "a", pe.Rule)
	require.True(t, errors.Is(err, policy.ErrInvalid))
}

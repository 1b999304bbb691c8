package ratefields_test

import (
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit"
	"github.com/ratesync/ratelimit/internal/ratefields"
)

var twoLimits = []ratelimit.Limit{{Window: time.Second, Max: 2}, {Window: time.Minute, Max: 3, Name: "per-minute"}}

func TestBuild(t *testing.T) {
	f, err := ratefields.Build(twoLimits)
	require.NoError(t, err)
	require.Equal(t, `"per-second";q=2;w=1, "per-minute";q=3;w=60`, f.Policy)
	require.Equal(t, []string{`"per-second"`, `"per-minute"`}, f.Names)
	require.Equal(t, len(`"per-second";r=;t=`)+30, f.MaxLen)
}

func TestBuildNoLimits(t *testing.T) {
	f, err := ratefields.Build(nil)
	require.NoError(t, err)
	require.Equal(t, ratefields.Fields{}, f)
}

// TestBuildQuota: a token bucket advertises its Burst per refill time; q is
// bounded to a structured-field integer and w rounded up to a second.
func TestBuildQuota(t *testing.T) {
	tb := []ratelimit.Limit{{Algorithm: ratelimit.TokenBucket, Window: time.Minute, Max: 100, Burst: 10, Name: "api"}}
	f, err := ratefields.Build(tb)
	require.NoError(t, err)
	require.Equal(t, `"api";q=10;w=6`, f.Policy)

	huge := []ratelimit.Limit{{Window: 1500 * time.Millisecond, Max: ratelimit.MaxValue, Name: "huge"}}
	f, err = ratefields.Build(huge)
	require.NoError(t, err)
	require.Equal(t, `"huge";q=999999999999999;w=2`, f.Policy)
}

func TestBuildBadName(t *testing.T) {
	_, err := ratefields.Build([]ratelimit.Limit{{Window: time.Second, Max: 1, Name: "caf\u00e9"}})
	require.ErrorContains(t, err, `policy name "café": `)
}

func TestAppend(t *testing.T) {
	f, err := ratefields.Build(twoLimits)
	require.NoError(t, err)
	b, r0, r1 := f.Append([]byte("x"), 1, ratelimit.Decision{Remaining: 42, Reset: 1500 * time.Millisecond})
	require.Equal(t, `x"per-minute";r=42;t=2`, string(b))
	require.Equal(t, "42", string(b[r0:r1]))

	// r is bounded to a structured-field integer; the value fits in MaxLen.
	b, r0, r1 = f.Append(nil, 0, ratelimit.Decision{Remaining: ratelimit.MaxValue, Reset: 100 * 365 * 24 * time.Hour})
	require.Equal(t, `"per-second";r=999999999999999;t=3153600000`, string(b))
	require.Equal(t, "999999999999999", string(b[r0:r1]))
	require.LessOrEqual(t, len(b), f.MaxLen)

	b, r0, r1 = f.Append(nil, 0, ratelimit.Decision{Reset: -time.Second})
	require.Equal(t, `"per-second";r=0;t=0`, string(b))
	require.Equal(t, "0", string(b[r0:r1]))
}

func TestValue(t *testing.T) {
	f, err := ratefields.Build(twoLimits)
	require.NoError(t, err)
	d := ratelimit.Decision{Remaining: 1, Reset: 2 * time.Second}
	const want = `"per-second";r=1;t=2`

	v, r0, r1 := f.Value(0, d, nil) // no spare: a string of its own
	require.Equal(t, want, v)
	require.Equal(t, "1", v[r0:r1])

	spare := make([]byte, 0, f.MaxLen)
	v, r0, r1 = f.Value(0, d, spare) // built in spare
	require.Equal(t, want, v)
	require.Equal(t, "1", v[r0:r1])
	require.Same(t, unsafe.SliceData(spare[:1]), unsafe.StringData(v))

	small := make([]byte, 0, f.MaxLen-1) // too small for every value: not used
	v, _, _ = f.Value(0, d, small)
	require.Equal(t, want, v)
	require.NotSame(t, unsafe.SliceData(small[:1]), unsafe.StringData(v))

	long := strings.Repeat("n", 200) // longer than Value's own buffer
	f, err = ratefields.Build([]ratelimit.Limit{{Window: time.Second, Max: 1, Name: long}})
	require.NoError(t, err)
	v, _, _ = f.Value(0, d, nil)
	require.Equal(t, `"`+long+`";r=1;t=2`, v)
}

package redis

import (
	"math"
	"strconv"
	"strings"

	"github.com/ratesync/ratelimit/strategy"
)

// bucketKey returns the key of a token bucket: a string "<tat> <interval>"
// (17 significant digits each, so that they read back bit for bit) in the
// hash tag of its key's shard, expiring at strategy.BucketExpiry plus
// Options.ExpiryMargin (see setBucket in lua/buckets.lua).
func bucketKey(prefix string, id strategy.BucketID) string {
	buf := make([]byte, 0, len(prefix)+24+len(id.Key))
	buf = append(buf, prefix...)
	buf = append(buf, "tb:"...)
	buf = strconv.AppendInt(buf, id.Period.Milliseconds(), 10)
	buf = append(buf, ':')
	buf = append(buf, id.Key...)
	return string(buf)
}

// parseBucket reads a bucket's state as a script or MGET returns it: nil
// when Redis holds none, and none for anything that is not a state (as the
// scripts read it).
func parseBucket(v any) strategy.BucketState {
	s, ok := v.(string)
	if !ok {
		return strategy.BucketState{}
	}
	t, i, ok := strings.Cut(s, " ")
	if !ok {
		return strategy.BucketState{}
	}
	tat, err1 := strconv.ParseFloat(t, 64)
	interval, err2 := strconv.ParseFloat(i, 64)
	if err1 != nil || err2 != nil || math.IsNaN(tat) || !(interval > 0) {
		return strategy.BucketState{}
	}
	return strategy.BucketState{TAT: tat, Interval: interval}
}

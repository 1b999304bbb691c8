package ratefields

import (
	"fmt"

	"github.com/ratesync/ratelimit"
)

// Compile is the step of compiling a rule that httplimit and grpclimit
// share: it returns a copy of limits (nil when there are none: the limits of
// an exempt rule, which need neither check nor fields), checked against ns,
// which will count them at cost, and their fields (Build). Its errors start
// with prefix, the package and the option at fault (for example
// `httplimit: Options.Rules[0] ("POST /login")`), then name what is wrong:
// "Limits: …" or "policy name …".
func Compile(prefix string, ns *ratelimit.Namespace, cost int64, limits []ratelimit.Limit) ([]ratelimit.Limit, Fields, error) {
	limits = append([]ratelimit.Limit(nil), limits...)
	if len(limits) == 0 {
		return limits, Fields{}, nil
	}
	if err := ns.CheckLimits(cost, limits...); err != nil {
		return nil, Fields{}, fmt.Errorf("%s: Limits: %w", prefix, err)
	}
	f, err := Build(limits)
	if err != nil {
		return nil, Fields{}, fmt.Errorf("%s: %w", prefix, err)
	}
	return limits, f, nil
}

package profiles

import (
	"fmt"
	"math/big"
	"strings"
)

// quantitySuffixes maps the suffixes of a Kubernetes resource quantity to
// their multipliers.
var quantitySuffixes = map[string]*big.Rat{
	"n": big.NewRat(1, 1_000_000_000), "u": big.NewRat(1, 1_000_000), "m": big.NewRat(1, 1000), "": big.NewRat(1, 1),
	"k": big.NewRat(1_000, 1), "M": big.NewRat(1_000_000, 1), "G": big.NewRat(1_000_000_000, 1),
	"T": new(big.Rat).SetInt64(1_000_000_000_000), "P": new(big.Rat).SetInt64(1_000_000_000_000_000),
	"E":  new(big.Rat).SetInt64(1_000_000_000_000_000_000),
	"Ki": big.NewRat(1<<10, 1), "Mi": big.NewRat(1<<20, 1), "Gi": big.NewRat(1<<30, 1),
	"Ti": new(big.Rat).SetInt64(1 << 40), "Pi": new(big.Rat).SetInt64(1 << 50), "Ei": new(big.Rat).SetInt64(1 << 60),
}

// parseWeight reads a traffic-split weight written as a Kubernetes quantity
// ("1", "500m", "0.25", "1e3") and returns it in Linkerd's units: the
// quantity's milli-value (rounded up, as Kubernetes does) times ten, so that
// "1" is 10000.
func parseWeight(s string) (uint32, error) {
	s = strings.TrimSpace(s)
	num, suffix := splitQuantity(s)
	if num == "" || strings.HasPrefix(num, "+") || strings.Count(num, ".") > 1 || strings.HasPrefix(num, ".") && len(num) == 1 {
		return 0, fmt.Errorf("%q is not a quantity", s)
	}
	if strings.HasPrefix(num, "-") {
		return 0, fmt.Errorf("%q is negative", s)
	}
	v, ok := new(big.Rat).SetString(num)
	if !ok {
		return 0, fmt.Errorf("%q is not a quantity", s)
	}
	if strings.HasPrefix(suffix, "e") || strings.HasPrefix(suffix, "E") && len(suffix) > 1 {
		exp, ok := new(big.Int).SetString(suffix[1:], 10)
		if !ok || exp.Cmp(big.NewInt(-30)) < 0 || exp.Cmp(big.NewInt(30)) > 0 {
			return 0, fmt.Errorf("%q has a bad exponent", s)
		}
		pow := new(big.Rat).SetInt(new(big.Int).Exp(big.NewInt(10), new(big.Int).Abs(exp), nil))
		if exp.Sign() < 0 {
			pow.Inv(pow)
		}
		v.Mul(v, pow)
	} else {
		mult, ok := quantitySuffixes[suffix]
		if !ok {
			return 0, fmt.Errorf("%q has an unknown suffix %q", s, suffix)
		}
		v.Mul(v, mult)
	}
	v.Mul(v, big.NewRat(1000, 1))
	milli := new(big.Int).Quo(v.Num(), v.Denom())
	if new(big.Rat).SetInt(milli).Cmp(v) < 0 {
		milli.Add(milli, big.NewInt(1))
	}
	w := new(big.Int).Mul(milli, big.NewInt(10))
	if !w.IsUint64() || w.Uint64() > 1<<32-1 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return uint32(w.Uint64()), nil
}

func splitQuantity(s string) (num, suffix string) {
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.' || i == 0 && (s[i] == '-' || s[i] == '+')) {
		i++
	}
	return s[:i], s[i:]
}

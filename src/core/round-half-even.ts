/**
 * Python's `round(x, 3)` for finite x in the range loads live in. It differs from
 * `Number(x.toFixed(3))` only on exact binary halves (x·16 odd: 0.0625, 0.1875, …), where
 * Python rounds half to even and toFixed rounds half up; the seed reports loads with it.
 */
export function roundHalfEven3(x: number): number {
  const sixteenths = x * 16; // exact: multiplying by a power of two
  if (Number.isInteger(sixteenths) && sixteenths % 2 !== 0) {
    const thousandths = Math.floor(x * 1000); // x·1000 = k·62.5, exact
    return (thousandths % 2 === 0 ? thousandths : thousandths + 1) / 1000;
  }
  return Number(x.toFixed(3));
}

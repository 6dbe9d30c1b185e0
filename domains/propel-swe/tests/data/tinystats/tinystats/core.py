def mean(values):
    if not values:
        raise ValueError("mean of no values")
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value


def window(values, size):
    return [values[i : i + size] for i in range(len(values) - size + 1)]


def is_sorted(values):
    return all(a <= b for a, b in zip(values, values[1:]))

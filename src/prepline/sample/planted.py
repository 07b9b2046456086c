"""Items planted in the sample with their ground truth: PII values (valid Luhn card numbers and
IBANs, fictional phone ranges, example.* mail domains, IPv4 addresses) in sentence templates, and
offensive sentences for the profanity filter (written for this module)."""

from __future__ import annotations

import random

from prepline.sample.text import _BOUNDARY


# Offensive sentences planted for the profanity filter (written for this module).
_PROFANITY = [
    "This is fucking bullshit.",
    "What a stupid piece of shit this is.",
    "Shut the fuck up, you moron.",
    "You are a worthless asshole.",
    "Damn this crap, it is a goddamn disaster.",
    "Go to hell, you bastard.",
    "Screw you and your shitty excuses.",
    "Only a dumb motherfucker would believe that.",
    "What the fuck is wrong with these idiots?",
    "That dickhead ruined everything again.",
    "Nobody cares about your crappy opinion, jackass.",
    "Piss off, you pathetic loser.",
]

_FIRST = ["james", "mary", "john", "linda", "robert", "susan", "michael", "karen", "david",
          "lisa", "anna", "peter", "julia", "thomas", "sofia", "lucas", "emma", "noah"]

_LAST = ["smith", "johnson", "brown", "miller", "davis", "garcia", "wilson", "moore",
         "taylor", "martin", "lee", "walker", "young", "king", "wright", "lopez"]

_MAIL_DOMAINS = ["example.com", "example.org", "example.net", "mail.example.com", "corp.example.org"]
_US_AREA = ["212", "310", "312", "415", "617", "206", "303", "512", "702", "404", "305", "713"]
_PII_TEMPLATES = {
    "EMAIL_ADDRESS": [
        "For questions, email {} and we will reply within a day.",
        "You can reach the author at {} for comments.",
        "Send your application to {} before Friday.",
    ],
    "PHONE_NUMBER": [
        "Call {} for more information.",
        "Readers can phone {} during office hours.",
        "The hotline number {} is open every day.",
    ],
    "CREDIT_CARD": [
        "The card {} was charged twice for the same order.",
        "Please bill my card number {} for the subscription.",
        "Payment was made with card {} on Monday.",
    ],
    "IBAN_CODE": [
        "Donations can be sent to IBAN {} with the reference SAMPLE.",
        "Transfer the deposit to account {} by the end of the month.",
        "The refund went to IBAN {} last week.",
    ],
    "IP_ADDRESS": [
        "The requests came from the address {} according to the logs.",
        "Our monitoring flagged {} as the source of the attack.",
        "The server at {} stopped answering at noon.",
    ],
}

_PII_TYPES = list(_PII_TEMPLATES)


def _luhn_check_digit(payload: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(payload)):
        d = int(ch)
        if i % 2 == 0:  # these digits are doubled once the check digit is appended
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return str((10 - total % 10) % 10)


def _digits(rng: random.Random, n: int) -> str:
    return "".join(str(rng.randrange(10)) for _ in range(n))


def _credit_card(rng: random.Random) -> str:
    brand = rng.choice(["visa", "mastercard", "amex", "discover"])
    if brand == "visa":
        payload = "4" + _digits(rng, 14)
    elif brand == "mastercard":
        payload = str(rng.randint(51, 55)) + _digits(rng, 13)
    elif brand == "amex":
        payload = rng.choice(["34", "37"]) + _digits(rng, 12)
    else:
        payload = "6011" + _digits(rng, 11)
    number = payload + _luhn_check_digit(payload)
    style = rng.choice(["plain", "space", "dash"])
    if style == "plain":
        return number
    sep = " " if style == "space" else "-"
    if len(number) == 15:
        return sep.join([number[:4], number[4:10], number[10:]])
    return sep.join(number[i : i + 4] for i in range(0, 16, 4))


def _iban(rng: random.Random) -> str:
    country = rng.choice(["DE", "GB", "FR", "NL", "ES"])
    letters = lambda n: "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(n))  # noqa: E731
    if country == "DE":
        bban = _digits(rng, 18)
    elif country == "GB":
        bban = letters(4) + _digits(rng, 14)
    elif country == "FR":
        bban = _digits(rng, 23)
    elif country == "NL":
        bban = letters(4) + _digits(rng, 10)
    else:
        bban = _digits(rng, 20)
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    check = 98 - int(numeric) % 97
    iban = f"{country}{check:02d}{bban}"
    if rng.random() < 0.5:
        return iban
    return " ".join(iban[i : i + 4] for i in range(0, len(iban), 4))


def _phone(rng: random.Random) -> str:
    area = rng.choice(_US_AREA)
    line = f"01{rng.randrange(100):02d}"  # 555-0100..0199: fictional US numbers
    uk = f"{rng.randrange(1000):03d}"
    return rng.choice(
        [
            f"({area}) 555-{line}",
            f"{area}-555-{line}",
            f"{area}.555.{line}",
            f"+1 {area} 555 {line}",
            f"+1-{area}-555-{line}",
            f"+44 20 7946 0{uk}",  # fictional London range
            f"+44 113 496 0{uk}",  # fictional Leeds range
        ]
    )


def _email(rng: random.Random) -> str:
    first, last = rng.choice(_FIRST), rng.choice(_LAST)
    local = rng.choice([f"{first}.{last}", f"{first}{rng.randint(1, 99)}", f"{first[0]}{last}", f"{last}_{first}"])
    return f"{local}@{rng.choice(_MAIL_DOMAINS)}"


def _ip(rng: random.Random) -> str:
    r = rng.randrange(5)
    if r == 0:
        return f"192.0.2.{rng.randint(1, 254)}"
    if r == 1:
        return f"198.51.100.{rng.randint(1, 254)}"
    if r == 2:
        return f"203.0.113.{rng.randint(1, 254)}"
    if r == 3:
        return f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randint(1, 254)}"
    return f"192.168.{rng.randrange(256)}.{rng.randint(1, 254)}"


_PII_MAKERS = {
    "EMAIL_ADDRESS": _email,
    "PHONE_NUMBER": _phone,
    "CREDIT_CARD": _credit_card,
    "IBAN_CODE": _iban,
    "IP_ADDRESS": _ip,
}


def _insert_sentence(text: str, sentence: str, rng: random.Random) -> str:
    spots = [m.start() for m in _BOUNDARY.finditer(text)]
    if not spots:
        return f"{text} {sentence}" if text else sentence
    at = rng.choice(spots)
    return f"{text[:at]} {sentence}{text[at:]}"

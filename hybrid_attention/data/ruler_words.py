"""Plain English words of the RULER tasks (``data/ruler.py``): the keys of the needles (adjective-noun pairs) and the
word lists of common-word extraction. Shipped with the package, so generating a task needs no download."""

from __future__ import annotations

ADJECTIVES = """
able absent acid active actual afraid agile alert alive ancient angry anxious awake aware bad bald basic bitter black
blank blind blue bold bored brave brief bright brisk broad broken brown busy calm capable careful casual cheap cheerful
chief civil clean clear clever close cloudy coarse cold common complex cool correct cosmic crazy crisp crude cruel
curious curly cute damp dark dear deep dense direct dirty dizzy dry dull dusty eager early easy elastic empty equal
exact exotic faint fair fake famous fancy fast fat fierce final fine firm flat fluffy formal foggy frank free fresh
friendly frozen full funny fuzzy gentle giant glad global golden good grand gray great green grim gross happy hard
harsh heavy helpful hidden high hollow honest huge humble hungry icy ideal idle large late lazy lean legal level light
little lively local lonely long loose loud lovely low loyal lucky mad magic major manual massive mature mean medical
mellow mild minor modern moist narrow nasty native neat nervous new nice noble noisy normal novel odd old open orange
pale patient plain plastic pleasant polite poor prime proud pure purple quick quiet rapid rare raw ready real red
regular rich rigid ripe rough round royal rude rural rusty sad safe salty sharp shiny short shy silent silly simple
slim slow small smart smooth snowy soft solid sour spare spicy stable steady steep stiff strange strict strong sudden
sunny super sweet swift tall tame tender thick thin tidy tight tiny tired tough tricky true ugly unique upset urban
vague valid vast violet vivid warm weak wealthy weary weird wet white whole wide wild windy wise witty wooden yellow
young zealous
""".split()

NOUNS = """
actor advice airport alarm album anchor angle animal ankle answer apple arch area arm army arrow artist atom attic
aunt author baby bag baker ball banana band bank barn basket bath beach bean bear beard bed bee bell belt bench berry
bike bird blade blanket boat body bone book boot bottle box brain branch bread brick bridge brother brush bubble
bucket bus butter button cabin cable cake camel camera camp canal candle canvas cap captain car card carpet cart
castle cat cave cell chair chalk cheese cherry chest chicken child church circle city clock cloud clown coach coast
coat coffee coin collar comet copper corner cotton cousin cow crab crane crowd crown cup curtain cushion dancer desk
diamond dinner doctor dog doll dolphin door dragon drawer dream dress drum duck eagle ear earth egg elbow engine
eye fabric face factory farm feather fence field finger fire fish flag flame flower flute fog folder forest fork
fountain fox frog fruit garden gate ghost gift giraffe glass glove goat gold grape grass guitar hammer hand harbor
hat hawk heart helmet hill horse hospital hotel house island jacket jar jelly jewel judge kettle key king kitchen
kite knee knife ladder lake lamp leaf lemon letter library lion lizard lock lunch magnet map marble market mask
meadow melon mirror monkey moon mountain mouse mug museum nail needle nest net night novel nurse ocean office onion
orbit owl oyster paint palace panda paper parrot path peach pearl pencil pepper piano pillow pilot pipe planet plate
pocket poet pond potato prince puzzle queen rabbit radio rain river road robot rocket roof rope rose sail salad
salt sand saucer scarf school scissors sea seed shadow sheep shell ship shirt shoe shovel singer sister skirt sky
snake snow soap sock sofa soldier spider spoon spring square stable star station stone storm stove street sugar
suit sun swan sword table tail teacher temple tent thread throne ticket tiger timber toast tomato tooth torch tower
town toy tractor train tree truck trumpet tunnel turtle umbrella uncle valley vase violin volcano wagon wall wallet
watch water whale wheel whistle window wing winter wizard wolf wood yacht yard zebra
""".split()

VERBS = """
accept add admire agree allow answer argue arrange arrive ask attack avoid bake balance bathe battle beg behave
belong blink boil borrow bounce breathe build burn bury calculate call carry carve catch change chase cheer chew
choose clap climb collect comb compare complain count crawl cross cry cycle dance decide deliver describe destroy
dig discover dive divide drag draw dream drink drive drop dust earn enjoy enter escape explain explore fetch fill
find fix float fly fold follow forgive gather glow grab greet grow guard guess hang hide hop hug hum hunt hurry
imagine invent jog join juggle jump kick kneel knit knock laugh lead learn lend lift listen march marry measure melt
mend mix move nod obey offer open order paint pack paddle pause peel pinch plant play point polish pour pray print
pull push race rain reach read relax remember repair repeat rescue rest return ride ring rinse roll row rub run sail
scrub search sew shake share shiver shout sing sink sip skate sketch ski skip sleep slide smile sneeze sniff solve
sort spell spill spin splash sprint stack stare steer stir stretch study swim swing talk taste teach tickle trace
travel trust tumble twist type unlock unpack vanish visit wander wash watch wave weave whisper whistle wink wish
wobble worry wrap write yawn yell zoom
""".split()
